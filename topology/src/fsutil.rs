//! The one bounded file reader: configuration files, specs and requests are read whole, and a
//! file larger than its limit is refused rather than read into memory.

use std::io::{self, Read};
use std::path::Path;

/// Reads a whole file; more than `limit` bytes is an error of kind `FileTooLarge`.
pub fn read_bounded(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(limit + 1)
        .read_to_end(&mut bytes)?;
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
}
