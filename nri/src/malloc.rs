//! The plugin's use of glibc's malloc. One process holds the checks of every pod of the node,
//! so what it keeps resident is counted once for the node, and kept small on purpose.

/// One malloc arena for all of the plugin's threads, as the wrapper's daemon runs with
/// `MALLOC_ARENA_MAX=1`: glibc gives threads that allocate at once arenas of their own (up to
/// eight per core), each holding on to what it once had; the plugin allocates little and
/// rarely, on a request's thread and its writers, so the extra arenas only add to what it
/// keeps resident. Set first in the process, before any thread exists, so that it holds
/// however the plugin is started (the DaemonSet sets the variable as well).
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(unsafe_code, reason = "glibc's mallopt has no safe binding")]
pub(crate) fn one_arena() {
    // SAFETY: mallopt only sets a malloc tunable; it takes two integers and touches no
    // memory of ours. Called first in the process, before any other thread could allocate.
    let _ = unsafe { libc::mallopt(libc::M_ARENA_MAX, 1) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn one_arena() {}

/// Gives the heap's free pages back to the system (glibc's `malloc_trim`). What a removed
/// pod's checks held is free once they are dropped, but stays resident where it lies in the
/// middle of the heap: glibc only returns a free top of the heap on its own.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
#[expect(unsafe_code, reason = "glibc's malloc_trim has no safe binding")]
pub(crate) fn trim() {
    // SAFETY: malloc_trim takes the allocator's own locks and only releases pages of free
    // chunks; it touches no memory in use, and any thread may call it at any time.
    let _ = unsafe { libc::malloc_trim(0) };
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
pub(crate) fn trim() {}
