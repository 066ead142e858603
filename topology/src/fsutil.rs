//! The one bounded file reader: configuration files, specs and requests are read whole, and a
//! file larger than its limit is refused rather than read into memory. Files of procfs and
//! debugfs are read without following a symbolic link ([`read_bounded_nofollow`]).

use std::fs::{File, OpenOptions};
use std::io::{self, Read};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

/// Reads a whole file; more than `limit` bytes is an error of kind `FileTooLarge`.
pub fn read_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    read_limited(File::open(path)?, limit)
}

/// [`read_bounded`] that refuses a symbolic link as the last component (`O_NOFOLLOW`): the
/// process files the VM view reads are the kernel's, never a link to elsewhere.
pub fn read_bounded_nofollow(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)?;
    read_limited(file, limit)
}

fn read_limited(file: File, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    file.take(limit + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > limit {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("larger than {limit} bytes"),
        ));
    }
    Ok(bytes)
}

/// [`read_bounded`] for UTF-8 text.
pub fn read_text_bounded(path: &Path, limit: u64) -> io::Result<String> {
    String::from_utf8(read_bounded(path, limit)?)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_files_over_the_limit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("f");
        std::fs::write(&p, "12345").expect("write");
        assert_eq!(read_text_bounded(&p, 5).expect("fits"), "12345");
        let e = read_bounded(&p, 4).expect_err("too large");
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
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
    fn nofollow_refuses_a_link() {
        let dir = tempfile::tempdir().expect("tempdir");
        let target = dir.path().join("target");
        std::fs::write(&target, "secret").expect("write");
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).expect("symlink");
        assert_eq!(read_bounded(&link, 64).expect("followed"), b"secret");
        assert!(read_bounded_nofollow(&link, 64).is_err());
        assert_eq!(read_bounded_nofollow(&target, 64).expect("file"), b"secret");
        assert_eq!(
            read_bounded_nofollow(&target, 3)
                .expect_err("too large")
                .kind(),
            io::ErrorKind::FileTooLarge
        );
    }
}
