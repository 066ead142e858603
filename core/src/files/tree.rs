//! Another system's files under a root: the node's `/` mounted at `/host` in the installer's
//! container, where root writes files that other processes of the node will run and read.
//!
//! - Every directory is reached from the root one component at a time with `O_NOFOLLOW`: a
//!   symbolic link anywhere on a path is refused, never followed, so a write through the root
//!   never lands outside the directory it names (`/opt/kata-topo/bin` a link to
//!   `/etc/sudoers.d` is an error, not a write there).
//! - Each directory on the way must belong to this process's user (root) and be writable by
//!   nobody else; a sticky directory (`/tmp`) may be on the way but is never written in. A
//!   missing directory is made (with the mode asked) and reported, so the caller can remove
//!   exactly what it made.
//! - A file is replaced durably and in two steps the caller can undo: [`Dir::stage`] writes a
//!   fresh temporary file (`O_CREAT | O_EXCL | O_NOFOLLOW`, its mode set exactly, `fsync`ed),
//!   [`Dir::commit`] renames it over the name and `fsync`s the directory; [`Dir::keep`] links
//!   the current file aside first, [`Dir::restore`] puts it back.

use std::fs::File;
use std::io::{self, Write};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};

use super::dir::{check_name, random_suffix, untrusted, Dir};

/// What is at a name in a directory (never following a symbolic link).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// Nothing.
    Missing,
    /// A regular file with this mode (permission bits) and owner.
    File {
        /// The permission bits (`0o7777`).
        mode: u32,
        /// The owner's uid.
        uid: u32,
    },
    /// A directory.
    Directory,
    /// A symbolic link to this target.
    Symlink(PathBuf),
    /// Anything else (a FIFO, a socket, a device).
    Other,
}

/// A temporary file (or link) written beside a name, not yet renamed over it.
#[derive(Debug)]
#[must_use = "a staged file is committed or discarded"]
pub struct Staged {
    tmp: String,
}

/// The root of another system's tree, opened once.
#[derive(Debug)]
pub struct Root {
    dir: Dir,
}

/// Flags every directory is opened with.
fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC
}

/// The components of an absolute path without `.`, `..` or an empty name.
pub fn components(path: &Path) -> io::Result<Vec<String>> {
    if !path.is_absolute() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: not an absolute path", path.display()),
        ));
    }
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir => {}
            Component::Normal(name) => {
                let name = name.to_str().ok_or_else(|| {
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("{}: not UTF-8", path.display()),
                    )
                })?;
                out.push(name.to_string());
            }
            Component::CurDir | Component::ParentDir | Component::Prefix(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{}: `.` and `..` are not allowed here", path.display()),
                ))
            }
        }
    }
    // `Path::components` drops a `.` in the middle silently: say so rather than accept it.
    if path.to_string_lossy().split('/').any(|p| p == ".") {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: `.` and `..` are not allowed here", path.display()),
        ));
    }
    Ok(out)
}

impl Root {
    /// Opens the root directory itself (its last component is not followed when a link).
    pub fn open(path: &Path) -> io::Result<Self> {
        Ok(Self {
            dir: Dir::open(path)?,
        })
    }

    /// Where it was opened.
    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    /// The root as a directory (for a file at the top of the tree).
    pub fn dir(&self) -> &Dir {
        &self.dir
    }

    /// The directory at `node_path` (absolute, as the tree's own system names it), reached
    /// without following a link, each directory on the way checked; `None` when a component
    /// is missing. The directory itself must be writable by nobody but this user.
    pub fn find_dir(&self, node_path: &Path) -> io::Result<Option<Dir>> {
        self.walk(node_path, None).map(|r| r.map(|(d, _)| d))
    }

    /// The directory at `node_path`, made (with `mode`, parents too) when missing; also the
    /// node paths of the directories it made, shallowest first.
    pub fn make_dir(&self, node_path: &Path, mode: u32) -> io::Result<(Dir, Vec<PathBuf>)> {
        self.walk(node_path, Some(mode))?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                format!("{}: not found", node_path.display()),
            )
        })
    }

    fn walk(
        &self,
        node_path: &Path,
        create: Option<u32>,
    ) -> io::Result<Option<(Dir, Vec<PathBuf>)>> {
        let parts = components(node_path)?;
        let mut made = Vec::new();
        let mut here = PathBuf::from("/");
        let mut fd = rustix::fs::openat(&self.dir.fd, ".", dir_flags(), Mode::empty())?;
        let shown = |p: &Path| format!("{} (under {})", p.display(), self.path().display());
        let last = parts.len();
        check_dir_trust(&fd, &shown(&here), last == 0)?;
        for (i, name) in parts.iter().enumerate() {
            here.push(name);
            let mut opened = rustix::fs::openat(&fd, name.as_str(), dir_flags(), Mode::empty());
            if let (Err(rustix::io::Errno::NOENT), Some(mode)) = (&opened, create) {
                match rustix::fs::mkdirat(&fd, name.as_str(), Mode::from_raw_mode(mode)) {
                    Ok(()) => made.push(here.clone()),
                    Err(rustix::io::Errno::EXIST) => {}
                    Err(e) => return Err(io_at(e.into(), &shown(&here))),
                }
                opened = rustix::fs::openat(&fd, name.as_str(), dir_flags(), Mode::empty());
                if let Ok(new) = &opened {
                    if made.last() == Some(&here) {
                        // Exactly the mode asked, whatever the umask.
                        rustix::fs::fchmod(new, Mode::from_raw_mode(mode))
                            .map_err(|e| io_at(e.into(), &shown(&here)))?;
                    }
                }
            }
            fd = match opened {
                Ok(next) => next,
                Err(rustix::io::Errno::NOENT) => return Ok(None),
                Err(e @ (rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR)) => {
                    let link = rustix::fs::statat(&fd, name.as_str(), AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
                    if link {
                        return Err(untrusted(format!(
                            "{} is a symbolic link, which is not followed here",
                            shown(&here)
                        )));
                    }
                    return Err(io_at(e.into(), &shown(&here)));
                }
                Err(e) => return Err(io_at(e.into(), &shown(&here))),
            };
            check_dir_trust(&fd, &shown(&here), i + 1 == last)?;
        }
        Ok(Some((
            Dir {
                fd,
                path: self
                    .path()
                    .join(node_path.strip_prefix("/").unwrap_or(node_path)),
            },
            made,
        )))
    }
}

/// A directory on the way must be this user's and writable by nobody else, except that a
/// sticky one (`/tmp`) may be passed through; the one written in (`last`) never sticky.
fn check_dir_trust(fd: &impl std::os::fd::AsFd, shown: &str, last: bool) -> io::Result<()> {
    let st = rustix::fs::fstat(fd)?;
    let me = rustix::process::geteuid().as_raw();
    let mode = st.st_mode & 0o7777;
    if st.st_uid != me {
        return Err(untrusted(format!(
            "{shown}: the directory belongs to uid {}, not {me}",
            st.st_uid
        )));
    }
    let sticky_ok = !last && mode & 0o1000 != 0;
    if mode & 0o022 != 0 && !sticky_ok {
        return Err(untrusted(format!(
            "{shown}: the directory may be written by others than its owner (mode {mode:04o})"
        )));
    }
    Ok(())
}

fn io_at(e: io::Error, shown: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{shown}: {e}"))
}

impl Dir {
    /// What is at `name`, without following a link.
    pub fn entry(&self, name: &str) -> io::Result<Entry> {
        check_name(name)?;
        let st = match rustix::fs::statat(&self.fd, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(rustix::io::Errno::NOENT) => return Ok(Entry::Missing),
            Err(e) => return Err(self.at(name, e.into())),
        };
        Ok(match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Entry::File {
                mode: st.st_mode & 0o7777,
                uid: st.st_uid,
            },
            FileType::Directory => Entry::Directory,
            FileType::Symlink => Entry::Symlink(self.read_link(name)?),
            _ => Entry::Other,
        })
    }

    /// The target of the symbolic link `name`.
    pub fn read_link(&self, name: &str) -> io::Result<PathBuf> {
        check_name(name)?;
        let target = rustix::fs::readlinkat(&self.fd, name, Vec::new())
            .map_err(|e| self.at(name, e.into()))?;
        Ok(PathBuf::from(target.to_string_lossy().into_owned()))
    }

    /// Reads the regular file `name` whole, at most `limit` bytes, never through a link or
    /// from a FIFO; `None` when nothing is there.
    pub fn read_file(&self, name: &str, limit: u64) -> io::Result<Option<Vec<u8>>> {
        check_name(name)?;
        let fd = match rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::NONBLOCK | OFlags::NOCTTY | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(rustix::io::Errno::NOENT) => return Ok(None),
            Err(rustix::io::Errno::LOOP) => {
                return Err(untrusted(format!(
                    "{}: is a symbolic link, which is not followed here",
                    self.path.join(name).display()
                )))
            }
            Err(e) => return Err(self.at(name, e.into())),
        };
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file", self.path.join(name).display()),
            ));
        }
        rustix::fs::fcntl_setfl(&fd, OFlags::RDONLY)?;
        super::read::read_to_limit(File::from(fd), limit)
            .map(Some)
            .map_err(|e| self.at(name, e))
    }

    /// The directory `name` inside this one, not through a link, checked as [`Root`] checks
    /// every directory; `None` when missing.
    pub fn open_child(&self, name: &str) -> io::Result<Option<Dir>> {
        check_name(name)?;
        match rustix::fs::openat(&self.fd, name, dir_flags(), Mode::empty()) {
            Ok(fd) => {
                let path = self.path.join(name);
                check_dir_trust(&fd, &path.display().to_string(), true)?;
                Ok(Some(Dir { fd, path }))
            }
            Err(rustix::io::Errno::NOENT) => Ok(None),
            Err(e) => Err(self.at(name, e.into())),
        }
    }

    /// Writes `bytes` to a new temporary file beside `name` with exactly `mode`, flushed to
    /// the disk; nothing at `name` changes until [`Dir::commit`].
    pub fn stage(&self, name: &str, bytes: &[u8], mode: u32) -> io::Result<Staged> {
        check_name(name)?;
        let (tmp, fd) = self.temporary(name, |tmp| {
            rustix::fs::openat(
                &self.fd,
                tmp,
                OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map(Some)
        })?;
        let Some(fd) = fd else {
            return Err(io::Error::other("no temporary file"));
        };
        let staged = Staged { tmp };
        let written = (|| {
            rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))?;
            let mut f = File::from(fd);
            f.write_all(bytes)?;
            f.sync_all()
        })();
        match written {
            Ok(()) => Ok(staged),
            Err(e) => {
                let what = self.at(name, e);
                self.discard(staged);
                Err(what)
            }
        }
    }

    /// A new symbolic link to `target` beside `name` (see [`Dir::stage`]).
    pub fn stage_symlink(&self, name: &str, target: &Path) -> io::Result<Staged> {
        check_name(name)?;
        let (tmp, _) = self.temporary(name, |tmp| {
            rustix::fs::symlinkat(target, &self.fd, tmp).map(|()| None::<std::os::fd::OwnedFd>)
        })?;
        Ok(Staged { tmp })
    }

    fn temporary<T>(
        &self,
        name: &str,
        mut make: impl FnMut(&str) -> rustix::io::Result<Option<T>>,
    ) -> io::Result<(String, Option<T>)> {
        let mut attempts = 0;
        loop {
            let tmp = format!(".{name}.{:016x}.tmp", random_suffix());
            match make(tmp.as_str()) {
                Ok(made) => return Ok((tmp, made)),
                Err(rustix::io::Errno::EXIST) if attempts < 8 => attempts += 1,
                Err(e) => return Err(self.at(name, e.into())),
            }
        }
    }

    /// Renames a staged file over `name` and flushes the directory.
    pub fn commit(&self, staged: Staged, name: &str) -> io::Result<()> {
        check_name(name)?;
        let renamed = rustix::fs::renameat(&self.fd, staged.tmp.as_str(), &self.fd, name);
        if let Err(e) = renamed {
            let what = self.at(name, e.into());
            self.discard(staged);
            return Err(what);
        }
        self.sync()
    }

    /// Removes a staged file.
    pub fn discard(&self, staged: Staged) {
        let _ = rustix::fs::unlinkat(&self.fd, staged.tmp.as_str(), AtFlags::empty());
    }

    /// Links what is at `name` (a file, or a link itself) aside as `aside`, replacing an
    /// `aside` left from before; `false` when nothing is at `name`.
    pub fn keep(&self, name: &str, aside: &str) -> io::Result<bool> {
        check_name(name)?;
        check_name(aside)?;
        let _ = rustix::fs::unlinkat(&self.fd, aside, AtFlags::empty());
        match rustix::fs::linkat(&self.fd, name, &self.fd, aside, AtFlags::empty()) {
            Ok(()) => Ok(true),
            Err(rustix::io::Errno::NOENT) => Ok(false),
            Err(e) => Err(self.at(name, e.into())),
        }
    }

    /// Renames `aside` back over `name` (undoing a commit after [`Dir::keep`]).
    pub fn restore(&self, aside: &str, name: &str) -> io::Result<()> {
        check_name(name)?;
        check_name(aside)?;
        rustix::fs::renameat(&self.fd, aside, &self.fd, name)
            .map_err(|e| self.at(name, e.into()))?;
        self.sync()
    }

    /// Removes the empty directory `name`: `Ok(false)` when it is not empty or not there.
    pub fn remove_dir(&self, name: &str) -> io::Result<bool> {
        check_name(name)?;
        match rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR) {
            Ok(()) => Ok(true),
            Err(
                rustix::io::Errno::NOENT | rustix::io::Errno::NOTEMPTY | rustix::io::Errno::EXIST,
            ) => Ok(false),
            Err(e) => Err(self.at(name, e.into())),
        }
    }

    /// Removes `name` and, when it is a directory, everything in it, never following a link
    /// (a link inside is removed, not what it names).
    pub fn remove_tree(&self, name: &str) -> io::Result<()> {
        check_name(name)?;
        match self.entry(name)? {
            Entry::Missing => Ok(()),
            Entry::Directory => {
                let fd = rustix::fs::openat(&self.fd, name, dir_flags(), Mode::empty())
                    .map_err(|e| self.at(name, e.into()))?;
                let child = Dir {
                    fd,
                    path: self.path.join(name),
                };
                for n in child.names()? {
                    child.remove_tree(&n)?;
                }
                rustix::fs::unlinkat(&self.fd, name, AtFlags::REMOVEDIR)
                    .map_err(|e| self.at(name, e.into()))
            }
            _ => rustix::fs::unlinkat(&self.fd, name, AtFlags::empty())
                .map_err(|e| self.at(name, e.into())),
        }
    }

    /// Flushes the directory's entries to the disk.
    pub fn sync(&self) -> io::Result<()> {
        rustix::fs::fsync(&self.fd).map_err(io::Error::from)
    }

    /// Takes an exclusive `flock` on the file `name` (made with `mode` when missing, never
    /// through a link), trying every 100 ms until `timeout`: the open file holds the lock until
    /// dropped. `Ok(None)` when another holder kept it all that time.
    pub fn lock(
        &self,
        name: &str,
        mode: u32,
        timeout: std::time::Duration,
    ) -> io::Result<Option<File>> {
        check_name(name)?;
        let fd = rustix::fs::openat(
            &self.fd,
            name,
            OFlags::RDWR | OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        )
        .map_err(|e| self.at(name, e.into()))?;
        let st = rustix::fs::fstat(&fd)?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: not a regular file", self.path.join(name).display()),
            ));
        }
        let deadline = std::time::Instant::now() + timeout;
        loop {
            match rustix::fs::flock(&fd, rustix::fs::FlockOperation::NonBlockingLockExclusive) {
                Ok(()) => return Ok(Some(File::from(fd))),
                Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR) => {}
                Err(e) => return Err(self.at(name, e.into())),
            }
            if std::time::Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    fn at(&self, name: &str, e: io::Error) -> io::Error {
        io::Error::new(e.kind(), format!("{}: {e}", self.path.join(name).display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::files::is_untrusted;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn node() -> (tempfile::TempDir, Root) {
        let tmp = tempfile::tempdir().expect("tempdir");
        std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o755))
            .expect("chmod");
        let root = Root::open(tmp.path()).expect("root");
        (tmp, root)
    }

    #[test]
    fn directories_are_made_with_their_mode_and_reported() {
        let (tmp, root) = node();
        std::fs::create_dir(tmp.path().join("opt")).expect("opt");
        let (dir, made) = root
            .make_dir(Path::new("/opt/kata-topo/bin"), 0o755)
            .expect("made");
        assert_eq!(
            made,
            [
                PathBuf::from("/opt/kata-topo"),
                PathBuf::from("/opt/kata-topo/bin")
            ]
        );
        assert_eq!(dir.path(), tmp.path().join("opt/kata-topo/bin"));
        let mode = std::fs::metadata(tmp.path().join("opt/kata-topo"))
            .expect("meta")
            .mode();
        assert_eq!(mode & 0o7777, 0o755);
        let (_, again) = root
            .make_dir(Path::new("/opt/kata-topo/bin"), 0o755)
            .expect("there");
        assert!(again.is_empty());
        assert!(root
            .find_dir(Path::new("/opt/none"))
            .expect("missing is fine")
            .is_none());
        for bad in ["relative", "/opt/../etc", "/opt/./x"] {
            let e = root.make_dir(Path::new(bad), 0o755).expect_err(bad);
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{bad}");
        }
    }

    #[test]
    fn a_link_on_the_way_or_a_directory_others_may_write_is_refused() {
        let (tmp, root) = node();
        let victim = tmp.path().join("etc/sudoers.d");
        std::fs::create_dir_all(&victim).expect("victim");
        std::fs::create_dir(tmp.path().join("opt")).expect("opt");
        std::os::unix::fs::symlink("/etc/sudoers.d", tmp.path().join("opt/kata-topo"))
            .expect("link");
        let e = root
            .make_dir(Path::new("/opt/kata-topo/bin"), 0o755)
            .expect_err("through a link");
        assert!(is_untrusted(&e), "{e}");
        assert!(e.to_string().contains("/opt/kata-topo"), "{e}");
        assert!(e.to_string().contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read_dir(&victim).expect("list").count(), 0);

        let shared = tmp.path().join("srv");
        std::fs::create_dir(&shared).expect("srv");
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = root
            .find_dir(Path::new("/srv"))
            .expect_err("world-writable");
        assert!(is_untrusted(&e) && e.to_string().contains("0777"), "{e}");
        // A sticky directory may be passed, not written in.
        std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        std::fs::create_dir(shared.join("mine")).expect("mine");
        root.find_dir(Path::new("/srv/mine"))
            .expect("through a sticky one")
            .expect("there");
        assert!(root.find_dir(Path::new("/srv")).is_err());
        std::os::unix::fs::chown(shared.join("mine"), Some(65534), None).expect("chown");
        let e = root
            .find_dir(Path::new("/srv/mine"))
            .expect_err("another owner");
        assert!(e.to_string().contains("uid 65534"), "{e}");
    }

    #[test]
    fn staged_files_commit_durably_keep_the_old_aside_and_restore() {
        let (tmp, root) = node();
        let dir = root.dir();
        let s = dir.stage("a", b"one", 0o640).expect("stage");
        assert_eq!(dir.entry("a").expect("entry"), Entry::Missing);
        dir.commit(s, "a").expect("commit");
        assert_eq!(
            dir.entry("a").expect("entry"),
            Entry::File {
                mode: 0o640,
                uid: rustix::process::geteuid().as_raw()
            }
        );
        let old = File::open(tmp.path().join("a")).expect("open");
        assert!(dir.keep("a", ".a.prev").expect("keep"));
        let s = dir.stage("a", b"two", 0o755).expect("stage");
        dir.commit(s, "a").expect("commit");
        assert_eq!(dir.read_file("a", 10).expect("read"), Some(b"two".to_vec()));
        assert_eq!(
            std::fs::read(tmp.path().join(".a.prev")).expect("aside"),
            b"one"
        );
        dir.restore(".a.prev", "a").expect("restore");
        assert_eq!(dir.read_file("a", 10).expect("read"), Some(b"one".to_vec()));
        assert_eq!(
            old.metadata().expect("meta").ino(),
            std::fs::metadata(tmp.path().join("a")).expect("meta").ino()
        );
        let s = dir.stage("b", b"x", 0o644).expect("stage");
        dir.discard(s);
        let names = dir.names().expect("names");
        assert_eq!(names, ["a"], "no temporary left");

        let l = dir
            .stage_symlink("link", Path::new("/opt/x"))
            .expect("link");
        dir.commit(l, "link").expect("commit");
        assert_eq!(
            dir.entry("link").expect("entry"),
            Entry::Symlink(PathBuf::from("/opt/x"))
        );
        let e = dir.read_file("link", 10).expect_err("not followed");
        assert!(is_untrusted(&e), "{e}");
        assert_eq!(dir.read_file("none", 10).expect("missing"), None);
    }

    #[test]
    fn trees_are_removed_without_following_links() {
        let (tmp, root) = node();
        let outside = tmp.path().join("keep");
        std::fs::create_dir(&outside).expect("keep");
        std::fs::write(outside.join("f"), "x").expect("f");
        std::fs::create_dir_all(tmp.path().join("t/a/b")).expect("tree");
        std::fs::write(tmp.path().join("t/a/b/f"), "x").expect("f");
        std::os::unix::fs::symlink(&outside, tmp.path().join("t/a/l")).expect("link");
        root.dir().remove_tree("t").expect("remove");
        assert!(!tmp.path().join("t").exists());
        assert!(outside.join("f").exists());
        std::fs::create_dir_all(tmp.path().join("d/e")).expect("d");
        assert!(!root.dir().remove_dir("d").expect("not empty"));
        let d = root.dir().open_child("d").expect("open").expect("there");
        assert!(d.remove_dir("e").expect("empty"));
        assert!(root.dir().remove_dir("d").expect("empty now"));
    }

    #[test]
    fn a_lock_is_held_until_dropped() {
        let (_tmp, root) = node();
        let short = std::time::Duration::from_millis(150);
        let held = root
            .dir()
            .lock("l.lock", 0o600, short)
            .expect("lock")
            .expect("free");
        assert!(root
            .dir()
            .lock("l.lock", 0o600, short)
            .expect("lock")
            .is_none());
        drop(held);
        assert!(root
            .dir()
            .lock("l.lock", 0o600, short)
            .expect("lock")
            .is_some());
    }
}
