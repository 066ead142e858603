//! The one bounded file reader. Every file kata-topo reads — specs, requests, baselines, state,
//! Kata's and kata-topo's configuration, topology XML, sysfs attributes — goes through here:
//!
//! - the file is opened with `O_NONBLOCK | O_NOCTTY`, so opening a FIFO (or a tty, or a device
//!   that waits for a carrier) never blocks;
//! - the open file is `fstat`ed and anything that is not a regular file (a FIFO, a device such
//!   as `/dev/zero`, a directory, a socket) is refused with an error naming its type;
//! - at most `limit` bytes are read: a longer file is an error of kind `FileTooLarge`, never
//!   read into memory. `st_size` is not trusted (procfs files say 0, sysfs files 4096).
//!
//! Symbolic links are followed by [`read_bounded`] (a path an operator names on a command line)
//! and refused by the `_nofollow` variants (a path inside a directory another user may write,
//! or a file kata-topo itself wrote). The no-follow variants refuse a link in the last path
//! component only (`O_NOFOLLOW`); the directories above it are the caller's to trust.

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::Path;

use rustix::fs::OFlags;

/// Whether a symbolic link in the last component of a path is followed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Symlinks {
    /// Follow it (an explicit path from an operator).
    Follow,
    /// Refuse it (`O_NOFOLLOW`): the read fails with an error saying so.
    Refuse,
}

/// Opens `path` for reading without blocking and checks that it is a regular file; the file
/// returned reads in blocking mode.
pub fn open_regular(path: &Path, symlinks: Symlinks) -> io::Result<File> {
    let mut flags = OFlags::NONBLOCK | OFlags::NOCTTY;
    if symlinks == Symlinks::Refuse {
        flags |= OFlags::NOFOLLOW;
    }
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits() as i32)
        .open(path)
        .map_err(|e| {
            let is_link =
                || std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
            if symlinks == Symlinks::Refuse && is_link() {
                io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "is a symbolic link, which is not followed here",
                )
            } else {
                e
            }
        })?;
    let file_type = file.metadata()?.file_type();
    if file_type.is_file() {
        // Back to blocking reads: O_NONBLOCK was for the open, and a network or FUSE file
        // system may honour it on a regular file with EAGAIN.
        let flags = rustix::fs::fcntl_getfl(&file)?;
        rustix::fs::fcntl_setfl(&file, flags - OFlags::NONBLOCK)?;
        return Ok(file);
    }
    let what = if file_type.is_fifo() {
        "a FIFO"
    } else if file_type.is_char_device() {
        "a character device"
    } else if file_type.is_block_device() {
        "a block device"
    } else if file_type.is_socket() {
        "a socket"
    } else if file_type.is_dir() {
        return Err(io::Error::new(
            io::ErrorKind::IsADirectory,
            "is a directory, not a regular file",
        ));
    } else {
        "not a regular file"
    };
    Err(io::Error::new(
        io::ErrorKind::InvalidInput,
        format!("is {what}, not a regular file"),
    ))
}

/// Reads everything `reader` gives, up to `limit` bytes; more is an error of kind
/// `FileTooLarge` (after reading `limit + 1` bytes, never more). For standard input and other
/// streams that are not files.
pub fn read_to_limit(reader: impl Read, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    reader
        .take(limit.saturating_add(1))
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(bytes)
}

/// Reads a whole regular file of at most `limit` bytes, following symbolic links.
pub fn read_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    read_to_limit(open_regular(path, Symlinks::Follow)?, limit)
}

/// [`read_bounded`] that refuses a symbolic link as the last component.
pub fn read_bounded_nofollow(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    read_to_limit(open_regular(path, Symlinks::Refuse)?, limit)
}

/// [`read_bounded`] for UTF-8 text.
pub fn read_text_bounded(path: &Path, limit: u64) -> io::Result<String> {
    utf8(read_bounded(path, limit)?)
}

/// [`read_bounded_nofollow`] for UTF-8 text.
pub fn read_text_bounded_nofollow(path: &Path, limit: u64) -> io::Result<String> {
    utf8(read_bounded_nofollow(path, limit)?)
}

fn utf8(bytes: Vec<u8>) -> io::Result<String> {
    String::from_utf8(bytes).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "not UTF-8"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::within_a_minute;
    use std::os::unix::net::UnixListener;

    fn fifo(path: &Path) {
        crate::testutil::mkfifo(path).expect("mkfifo");
    }

    #[test]
    fn refuses_files_over_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, "12345").expect("write");
        assert_eq!(read_text_bounded(&p, 5).expect("fits"), "12345");
        let e = read_bounded(&p, 4).expect_err("too large");
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        assert_eq!(e.to_string(), "larger than 4 bytes");
        std::fs::write(&p, [0xff, 0xfe]).expect("write");
        assert_eq!(
            read_text_bounded(&p, 5).expect_err("not utf-8").kind(),
            io::ErrorKind::InvalidData
        );
        assert_eq!(
            read_bounded(&dir.path().join("none"), 5)
                .expect_err("missing")
                .kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn never_trusts_the_size_the_file_reports() {
        // procfs files report a size of 0 and still have content.
        let status = read_text_bounded(Path::new("/proc/self/status"), 1 << 20).expect("read");
        assert!(status.contains("Pid:"), "{status}");
        assert_eq!(
            std::fs::metadata("/proc/self/status").expect("stat").len(),
            0
        );
        // And a limit holds however much a file would give.
        let e = read_bounded(Path::new("/proc/self/status"), 8).expect_err("over");
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
    }

    #[test]
    fn refuses_what_is_not_a_regular_file_without_blocking() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A FIFO nobody writes: opening it for reading would block without O_NONBLOCK.
        let f = dir.path().join("fifo");
        fifo(&f);
        let e = within_a_minute("reading a FIFO", move || read_bounded(&f, 10)).expect_err("fifo");
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        assert_eq!(e.to_string(), "is a FIFO, not a regular file");
        // An endless device.
        let e = read_bounded(Path::new("/dev/zero"), 10).expect_err("device");
        assert_eq!(e.to_string(), "is a character device, not a regular file");
        // A directory.
        let e = read_bounded(dir.path(), 10).expect_err("dir");
        assert_eq!(e.kind(), io::ErrorKind::IsADirectory);
        // A socket (it cannot be opened at all: ENXIO).
        let sock = dir.path().join("sock");
        let _listener = UnixListener::bind(&sock).expect("bind");
        assert!(read_bounded(&sock, 10).is_err());
    }

    #[test]
    fn nofollow_refuses_a_link_follow_reads_through_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("target");
        std::fs::write(&target, "secret").expect("write");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert_eq!(read_text_bounded(&link, 64).expect("follows"), "secret");
        let e = read_text_bounded_nofollow(&link, 64).expect_err("refused");
        assert_eq!(
            e.to_string(),
            "is a symbolic link, which is not followed here"
        );
        assert_eq!(
            read_text_bounded_nofollow(&target, 64).expect("plain file"),
            "secret"
        );
        // A dangling link is missing when followed, refused when not.
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).expect("symlink");
        assert_eq!(
            read_bounded(&dangling, 64).expect_err("missing").kind(),
            io::ErrorKind::NotFound
        );
        assert!(read_bounded_nofollow(&dangling, 64)
            .expect_err("refused")
            .to_string()
            .contains("symbolic link"));
        // A link to a FIFO is still a FIFO.
        let f = dir.path().join("fifo");
        fifo(&f);
        let to_fifo = dir.path().join("to-fifo");
        std::os::unix::fs::symlink(&f, &to_fifo).expect("symlink");
        assert!(
            within_a_minute("reading a FIFO", move || read_bounded(&to_fifo, 64))
                .expect_err("fifo")
                .to_string()
                .contains("FIFO")
        );
    }

    #[test]
    fn the_file_returned_reads_in_blocking_mode() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, "x").expect("write");
        let f = open_regular(&p, Symlinks::Refuse).expect("open");
        let flags = rustix::fs::fcntl_getfl(&f).expect("flags");
        assert!(!flags.contains(OFlags::NONBLOCK), "{flags:?}");
    }

    #[test]
    fn read_to_limit_bounds_a_stream() {
        assert_eq!(read_to_limit(&b"abc"[..], 3).expect("fits"), b"abc");
        assert_eq!(
            read_to_limit(io::repeat(0), 1000)
                .expect_err("endless")
                .kind(),
            io::ErrorKind::FileTooLarge
        );
        assert_eq!(read_to_limit(&b""[..], u64::MAX).expect("empty"), b"");
    }
}
