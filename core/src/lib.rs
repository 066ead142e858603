//! kata-topo core: what the host is (hwloc, sysfs), what a pod wants (annotations, baseline),
//! what a request asks (OCI spec, `LinuxResources`), and which rules that breaks.
//!
//! No async runtime and no transport here: the shim, the hook and the CLI are thin layers over
//! [`check::Checker`] and its one entry point per phase (`admit`, `recreate`, `update`,
//! `observe`), which give finished verdicts.

#![forbid(unsafe_code)]

pub mod cache;
pub mod check;
pub mod config;
pub mod files;
pub mod fsutil;
pub mod host;
pub mod idset;
pub mod intent;
pub mod kata;
pub mod kubelet;
pub mod pci;
pub mod policy;
pub mod process;
pub mod request;
pub mod rule;
pub mod simulate;
pub mod state;
pub mod sysfs;
pub mod text;
pub mod verdict;
pub mod vm;
pub mod wait;

/// kata-topo's version and the git revision it was built from, as every binary prints it
/// (`--version`) and as the topology cache's key includes it.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (",
    env!("KATA_TOPO_GIT_REV"),
    ")"
);

pub use check::{Checker, Overrides, Phase, Request, Running};
pub use host::{Host, Locality, TopologySource};
pub use idset::IdSet;
pub use intent::Baseline;
pub use pci::Bdf;
pub use policy::{Defaults, Mode, PodOverrides, Policy};
pub use request::{ContainerSpec, Resources};
pub use rule::{Finding, Rule, Severity};
pub use sysfs::Sysfs;
pub use verdict::{Decision, Operation, UpdateClass, Verdict};

#[cfg(test)]
pub(crate) mod testutil {
    //! A sysfs tree in a temporary directory that lives as long as the value, and FIFOs where
    //! a file is expected.

    /// Makes a FIFO at `path`.
    pub(crate) fn mkfifo(path: &std::path::Path) -> std::io::Result<()> {
        rustix::fs::mknodat(
            rustix::fs::CWD,
            path,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .map_err(std::io::Error::from)
    }

    use crate::pci::Bdf;
    use crate::simulate;

    pub(crate) struct SysfsTree {
        _dir: tempfile::TempDir,
        tree: simulate::SysfsTree,
    }

    impl SysfsTree {
        pub(crate) fn new() -> Self {
            let dir = tempfile::tempdir().expect("tempdir");
            let tree = simulate::SysfsTree::at(dir.path().join("sys")).expect("sysfs tree");
            Self { _dir: dir, tree }
        }

        pub(crate) fn root(&self) -> &std::path::Path {
            self.tree.root()
        }

        pub(crate) fn device(
            &self,
            bdf: Bdf,
            node: i32,
            driver: Option<&str>,
            group: Option<&str>,
        ) {
            self.tree
                .add_device(bdf, node, driver, group)
                .expect("add device");
        }

        pub(crate) fn iommufd(&self, name: &str, bdf: Bdf) {
            self.tree.add_iommufd(name, bdf).expect("add iommufd");
        }
    }

    /// Strings of up to `max` characters that a hostile pod author might write: any Unicode
    /// character (proptest's `any::<char>` favours NUL, tab, CR, LF, ESC, DEL, quotes and
    /// slashes), C1 controls, and the bidirectional overrides and isolates.
    pub(crate) fn hostile_text(max: usize) -> impl proptest::strategy::Strategy<Value = String> {
        use proptest::prelude::*;
        let c = prop_oneof![
            4 => any::<char>(),
            1 => (0x80u32..0xa0).prop_map(|c| char::from_u32(c).unwrap_or('?')),
            1 => prop::sample::select(vec![
                '\u{202a}', '\u{202b}', '\u{202c}', '\u{202d}', '\u{202e}', '\u{2066}',
                '\u{2067}', '\u{2068}', '\u{2069}', '\u{200e}', '\u{200f}', '\u{061c}',
                '\u{2028}', '\u{2029}',
            ]),
        ];
        prop::collection::vec(c, 0..=max).prop_map(|v| v.into_iter().collect())
    }

    /// Runs `f` on its own thread and fails the test if it has not returned within a minute:
    /// a guard against a read that blocks forever (a FIFO), not a measure of speed.
    pub(crate) fn within_a_minute<T: Send + 'static>(
        what: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        match run_for_a_minute(f) {
            Some(value) => value,
            None => panic!("{what} did not return: it blocks"),
        }
    }

    /// [`within_a_minute`] for property tests: a case that blocks aborts the test binary at
    /// once, naming its input, rather than have proptest shrink it a minute per attempt.
    pub(crate) fn within_a_minute_or_abort<T: Send + 'static>(
        what: &str,
        f: impl FnOnce() -> T + Send + 'static,
    ) -> T {
        match run_for_a_minute(f) {
            Some(value) => value,
            None => {
                // Straight to stderr: the test harness's capture would die with the process.
                use std::io::Write;
                let _ = writeln!(std::io::stderr(), "{what} did not return: it blocks");
                std::process::abort()
            }
        }
    }

    fn run_for_a_minute<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Option<T> {
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let _ = tx.send(std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)));
        });
        match rx.recv_timeout(std::time::Duration::from_secs(60)) {
            Ok(Ok(value)) => Some(value),
            Ok(Err(panic)) => std::panic::resume_unwind(panic),
            Err(_) => None,
        }
    }
}
