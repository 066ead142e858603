//! Files written in directories another user may write too (node-exporter's textfile
//! directory belongs to the `prometheus` user): the directory is opened once, without
//! following a symlink, and every file is created, replaced and removed relative to that open
//! directory. A new file is a fresh temporary one (`O_CREAT | O_EXCL | O_NOFOLLOW`, a random
//! name) renamed over the target, so a planted symlink or file is never written through and a
//! reader never sees half a file.

use std::fs::File;
use std::hash::{BuildHasher, Hasher};
use std::io::{self, Write};
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};

/// An open directory.
#[derive(Debug)]
pub struct Dir {
    pub(super) fd: OwnedFd,
    pub(super) path: PathBuf,
}

/// A name inside a directory: one component, not `.` or `..`.
pub(super) fn check_name(name: &str) -> io::Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{name:?} is not a file name"),
        ));
    }
    Ok(())
}

/// A name nobody can guess ahead of time.
pub(super) fn random_suffix() -> u64 {
    // std seeds every RandomState from the OS's randomness.
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_nanos(),
    );
    h.finish()
}

/// The open directory, for what needs its descriptor (an `flock` on it).
impl std::os::fd::AsFd for Dir {
    fn as_fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl Dir {
    /// Opens `path` as a directory; a symlink as its last component is refused.
    pub fn open(path: &Path) -> io::Result<Self> {
        let fd = rustix::fs::open(
            path,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )?;
        Ok(Self {
            fd,
            path: path.to_path_buf(),
        })
    }

    /// Opens `path` as a directory that only this process's effective user controls, or says
    /// why it is not one: no component of the path is a symbolic link (each is opened with
    /// `O_NOFOLLOW`, from `/` down, so none is followed), and the directory belongs to this
    /// user and nobody else may write in it ([`Dir::check_private`]). With `create`, missing
    /// components are made with that mode on the way. The topology cache and the state
    /// directory are opened through here: one check for both.
    ///
    /// A directory that fails the check is an error of kind `PermissionDenied` that
    /// [`is_untrusted`] recognises; anything else (missing, not a directory, a full disk) is
    /// the OS's error.
    pub fn open_private(path: &Path, create: Option<u32>) -> io::Result<Self> {
        use std::path::Component;
        if !path.is_absolute() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not an absolute path", path.display()),
            ));
        }
        let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let mut fd = rustix::fs::open("/", flags, Mode::empty())?;
        let mut walked = PathBuf::from("/");
        for component in path.components() {
            let name = match component {
                Component::RootDir | Component::CurDir => continue,
                Component::Normal(name) => name,
                Component::ParentDir | Component::Prefix(_) => {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: `..` is not allowed here", path.display()),
                    ))
                }
            };
            walked.push(name);
            let mut opened = rustix::fs::openat(&fd, name, flags, Mode::empty());
            if let (Err(rustix::io::Errno::NOENT), Some(mode)) = (&opened, create) {
                match rustix::fs::mkdirat(&fd, name, Mode::from_raw_mode(mode)) {
                    Ok(()) | Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(with_path(e.into(), &walked)),
                }
                opened = rustix::fs::openat(&fd, name, flags, Mode::empty());
            }
            fd = match opened {
                Ok(next) => next,
                Err(e @ (rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR)) => {
                    let link = rustix::fs::statat(&fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| {
                            rustix::fs::FileType::from_raw_mode(st.st_mode)
                                == rustix::fs::FileType::Symlink
                        });
                    if link {
                        return Err(untrusted(format!(
                            "{}: {} is a symbolic link, which is not followed here",
                            path.display(),
                            walked.display()
                        )));
                    }
                    return Err(with_path(e.into(), &walked));
                }
                Err(e) => return Err(with_path(e.into(), &walked)),
            };
        }
        let dir = Self {
            fd,
            path: path.to_path_buf(),
        };
        dir.check_private()?;
        Ok(dir)
    }

    /// Creates `path` (and missing parents, with `mode`), then opens it.
    pub fn create(path: &Path, mode: u32) -> io::Result<Self> {
        use std::os::unix::fs::DirBuilderExt;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(mode)
            .create(path)?;
        Self::open(path)
    }

    /// Where it was opened.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Replaces `name` with `bytes` whole: written to a new temporary file (`mode`), then
    /// renamed over `name`. The temporary name starts with a dot and ends in `.tmp`.
    pub fn write_atomic(&self, name: &str, bytes: &[u8], mode: u32) -> io::Result<()> {
        check_name(name)?;
        let mut attempts = 0;
        let (tmp, fd) = loop {
            let tmp = format!(".{name}.{:016x}.tmp", random_suffix());
            match rustix::fs::openat(
                &self.fd,
                tmp.as_str(),
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(mode),
            ) {
                Ok(fd) => break (tmp, fd),
                Err(rustix::io::Errno::EXIST) if attempts < 8 => attempts += 1,
                Err(e) => return Err(e.into()),
            }
        };
        let written = File::from(fd).write_all(bytes);
        let renamed = written.and_then(|()| {
            rustix::fs::renameat(&self.fd, tmp.as_str(), &self.fd, name).map_err(io::Error::from)
        });
        if renamed.is_err() {
            let _ = rustix::fs::unlinkat(&self.fd, tmp.as_str(), rustix::fs::AtFlags::empty());
        }
        renamed
    }

    /// Removes `name`; one that is not there is fine.
    pub fn remove(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        match rustix::fs::unlinkat(&self.fd, name, rustix::fs::AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Opens `name` for appending, creating it with `mode`; a symlink is refused. Opened
    /// non-blocking, so a FIFO without a reader, or a full one, never blocks the writer.
    pub fn open_append(&self, name: &str, mode: u32) -> io::Result<File> {
        check_name(name)?;
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::WRONLY
                | OFlags::APPEND
                | OFlags::CREATE
                | OFlags::NOFOLLOW
                | OFlags::NONBLOCK
                | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )?;
        Ok(File::from(fd))
    }

    /// Fails unless the directory belongs to this process's effective user and nobody else may
    /// write in it (no group or other write bit): only then are the files in it what that user
    /// put there.
    pub fn check_private(&self) -> io::Result<()> {
        let st = rustix::fs::fstat(&self.fd)?;
        private(&st, "directory")
            .map_err(|why| untrusted(format!("{}: {why}", self.path.display())))
    }

    /// Reads `name` whole, at most `limit` bytes, when it is a regular file (never through a
    /// symlink, never waiting on a FIFO) that belongs to this process's effective user and
    /// that nobody else may write. Anything else is an error of kind `PermissionDenied`
    /// (someone else could have written it) or `InvalidInput` (not a regular file).
    pub fn read_private(&self, name: &str, limit: u64) -> io::Result<Vec<u8>> {
        check_name(name)?;
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: is a symbolic link, which is not followed here"),
            ),
            e => io::Error::from(e),
        })?;
        let st = rustix::fs::fstat(&fd)?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{name}: not a regular file"),
            ));
        }
        private(&st, "file").map_err(|why| untrusted(format!("{name}: {why}")))?;
        // A regular file: blocking reads from here on.
        rustix::fs::fcntl_setfl(&fd, OFlags::RDONLY)?;
        super::read::read_to_limit(File::from(fd), limit)
    }

    /// The names in the directory (not `.` and `..`).
    pub fn names(&self) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&self.fd)? {
            let entry = entry?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name != "." && name != ".." {
                names.push(name);
            }
        }
        Ok(names)
    }

    /// The identity (device, inode) of what is at `name` now, without following a symlink;
    /// `None` when nothing is.
    pub fn identity(&self, name: &str) -> io::Result<Option<(u64, u64)>> {
        check_name(name)?;
        match rustix::fs::statat(&self.fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Ok(Some((st.st_dev, st.st_ino))),
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }
}

/// Why a directory or file is not trusted: someone other than this process's user could have
/// put or changed what is in it.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Untrusted(String);

pub(super) fn untrusted(why: String) -> io::Error {
    io::Error::new(io::ErrorKind::PermissionDenied, Untrusted(why))
}

/// Whether an error says a directory or file is not trusted (rather than that it could not be
/// read or made).
pub fn is_untrusted(e: &io::Error) -> bool {
    e.get_ref().is_some_and(|inner| inner.is::<Untrusted>())
}

fn with_path(e: io::Error, path: &Path) -> io::Error {
    io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Why a file or directory with this status is not private to this process's effective user.
fn private(st: &rustix::fs::Stat, what: &str) -> Result<(), String> {
    let me = rustix::process::geteuid().as_raw();
    let mode = st.st_mode & 0o7777;
    if st.st_uid != me {
        return Err(format!("the {what} belongs to uid {}, not {me}", st.st_uid));
    }
    if mode & 0o022 != 0 {
        return Err(format!(
            "the {what} may be written by others than its owner (mode {mode:04o})"
        ));
    }
    Ok(())
}

/// The identity (device, inode) of an open file.
pub fn identity(file: &File) -> io::Result<(u64, u64)> {
    let st = rustix::fs::fstat(file)?;
    Ok((st.st_dev, st.st_ino))
}

/// Replaces the file at `path` whole (see [`Dir::write_atomic`]).
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> io::Result<()> {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} is not a file path", path.display()),
        ));
    };
    Dir::open(dir)?.write_atomic(&name.to_string_lossy(), bytes, mode)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    #[test]
    fn replaces_whole_files_and_leaves_no_temporary() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = Dir::open(tmp.path()).expect("open");
        dir.write_atomic("a.prom", b"one", 0o640).expect("write");
        dir.write_atomic("a.prom", b"two", 0o640).expect("rewrite");
        assert_eq!(
            std::fs::read(tmp.path().join("a.prom")).expect("read"),
            b"two"
        );
        let meta = std::fs::metadata(tmp.path().join("a.prom")).expect("meta");
        assert_eq!(meta.permissions().mode() & 0o777, 0o640);
        let names: Vec<_> = std::fs::read_dir(tmp.path())
            .expect("list")
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("a.prom")]);
        dir.remove("a.prom").expect("remove");
        dir.remove("a.prom").expect("removing what is gone is fine");
        assert!(!tmp.path().join("a.prom").exists());
    }

    #[test]
    fn never_writes_through_a_planted_symlink() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let victim = tmp.path().join("victim");
        std::fs::write(&victim, "precious").expect("victim");
        let d = tmp.path().join("textfile");
        std::fs::create_dir(&d).expect("dir");
        std::os::unix::fs::symlink(&victim, d.join("m.prom")).expect("plant");
        let dir = Dir::open(&d).expect("open");
        dir.write_atomic("m.prom", b"metrics", 0o644)
            .expect("write");
        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
        assert!(!std::fs::symlink_metadata(d.join("m.prom"))
            .expect("meta")
            .file_type()
            .is_symlink());
        // The log file: a symlink at its name is refused, not followed.
        std::os::unix::fs::symlink(&victim, d.join("kt.log")).expect("plant");
        let e = dir
            .open_append("kt.log", 0o640)
            .expect_err("symlink refused");
        assert_eq!(e.raw_os_error(), Some(nix_eloop()));
        assert_eq!(std::fs::read(&victim).expect("victim"), b"precious");
    }

    fn nix_eloop() -> i32 {
        rustix::io::Errno::LOOP.raw_os_error()
    }

    #[test]
    fn refuses_a_symlinked_directory_and_bad_names() {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::os::unix::fs::symlink("/etc", tmp.path().join("link")).expect("plant");
        assert!(Dir::open(&tmp.path().join("link")).is_err());
        let dir = Dir::open(tmp.path()).expect("open");
        for bad in ["", ".", "..", "a/b", "../x"] {
            assert!(dir.write_atomic(bad, b"x", 0o600).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn the_directory_stays_the_one_opened() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = tmp.path().join("d");
        std::fs::create_dir(&d).expect("dir");
        let dir = Dir::open(&d).expect("open");
        // Someone swaps the directory for a symlink to another one after it was opened.
        let elsewhere = tmp.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).expect("elsewhere");
        std::fs::rename(&d, tmp.path().join("moved")).expect("move");
        std::os::unix::fs::symlink(&elsewhere, &d).expect("swap");
        dir.write_atomic("f", b"x", 0o600).expect("write");
        assert!(tmp.path().join("moved/f").exists());
        assert!(!elsewhere.join("f").exists());
    }

    #[test]
    fn private_files_are_read_only_when_nobody_else_could_have_written_them() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let d = tmp.path().join("state");
        let dir = Dir::create(&d, 0o700).expect("create");
        dir.check_private()
            .expect("a fresh 0700 directory is private");
        dir.write_atomic("a.xml", b"<x/>", 0o600).expect("write");
        assert_eq!(dir.read_private("a.xml", 16).expect("read"), b"<x/>");
        let e = dir.read_private("a.xml", 2).expect_err("over the limit");
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        let e = dir.read_private("gone.xml", 16).expect_err("missing");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);

        std::fs::set_permissions(d.join("a.xml"), std::fs::Permissions::from_mode(0o620))
            .expect("chmod");
        let e = dir.read_private("a.xml", 16).expect_err("group-writable");
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        assert!(e.to_string().contains("0620"), "{e}");
        std::fs::set_permissions(d.join("a.xml"), std::fs::Permissions::from_mode(0o644))
            .expect("chmod");
        dir.read_private("a.xml", 16)
            .expect("readable by others is fine");
        std::os::unix::fs::chown(d.join("a.xml"), Some(65534), None).expect("chown");
        let e = dir.read_private("a.xml", 16).expect_err("another owner");
        assert!(e.to_string().contains("uid 65534"), "{e}");

        std::os::unix::fs::symlink(d.join("a.xml"), d.join("b.xml")).expect("link");
        let e = dir.read_private("b.xml", 16).expect_err("symlink");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        std::fs::create_dir(d.join("c.xml")).expect("dir");
        assert!(dir.read_private("c.xml", 16).is_err());
        let mut names = dir.names().expect("names");
        names.sort();
        assert_eq!(names, ["a.xml", "b.xml", "c.xml"]);

        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let e = dir
            .check_private()
            .expect_err("world-writable, sticky or not");
        assert!(e.to_string().contains("1777"), "{e}");
    }

    #[test]
    fn a_private_directory_is_reached_through_no_symlink_and_trusted_only_when_private() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let made = tmp.path().join("a/b/state");
        let dir = Dir::open_private(&made, Some(0o700)).expect("made on the way");
        assert_eq!(dir.path(), made);
        for d in ["a", "a/b", "a/b/state"] {
            let mode = std::fs::metadata(tmp.path().join(d))
                .expect("meta")
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700, "{d}");
        }
        Dir::open_private(&made, None).expect("there now");
        let e = Dir::open_private(&tmp.path().join("missing"), None).expect_err("missing");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        assert!(!is_untrusted(&e), "{e}");

        // A symlink anywhere on the path: at the end, or a directory above.
        std::os::unix::fs::symlink(tmp.path().join("a"), tmp.path().join("l")).expect("link");
        std::os::unix::fs::symlink(&made, tmp.path().join("s")).expect("link");
        for (via, link) in [("l/b/state", "l"), ("s", "s")] {
            let e = Dir::open_private(&tmp.path().join(via), Some(0o700)).expect_err(via);
            assert!(is_untrusted(&e), "{via}: {e}");
            assert!(
                e.to_string().contains(&format!(
                    "{} is a symbolic link",
                    tmp.path().join(link).display()
                )),
                "{via}: {e}"
            );
        }
        // Nothing was made through the link.
        assert!(Dir::open_private(&tmp.path().join("l/new"), Some(0o700)).is_err());
        assert!(!tmp.path().join("a/new").exists());

        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o770)).expect("chmod");
        let e = Dir::open_private(&made, None).expect_err("group-writable");
        assert!(is_untrusted(&e) && e.to_string().contains("0770"), "{e}");
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::os::unix::fs::chown(&made, Some(65534), None).expect("chown");
        let e = Dir::open_private(&made, None).expect_err("another owner");
        assert!(
            is_untrusted(&e) && e.to_string().contains("uid 65534"),
            "{e}"
        );

        // A file on the path is not a directory, not a trust question.
        std::fs::write(tmp.path().join("f"), "x").expect("file");
        let e = Dir::open_private(&tmp.path().join("f/state"), Some(0o700)).expect_err("file");
        assert!(!is_untrusted(&e), "{e}");
        for bad in ["relative/state", "/tmp/../tmp"] {
            let e = Dir::open_private(Path::new(bad), None).expect_err(bad);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn identities_tell_a_rotated_file() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let dir = Dir::open(tmp.path()).expect("open");
        assert_eq!(dir.identity("kt.log").expect("stat"), None);
        let f = dir.open_append("kt.log", 0o640).expect("open");
        let id = identity(&f).expect("fstat");
        assert_eq!(dir.identity("kt.log").expect("stat"), Some(id));
        let meta = std::fs::metadata(tmp.path().join("kt.log")).expect("meta");
        assert_eq!((meta.dev(), meta.ino()), id);
        std::fs::rename(tmp.path().join("kt.log"), tmp.path().join("kt.log.1")).expect("rotate");
        assert_eq!(dir.identity("kt.log").expect("stat"), None);
    }
}
