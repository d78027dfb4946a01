//! A writer for the cpio "newc" format, the one the Linux kernel unpacks as an initramfs
//! (Documentation/driver-api/early-userspace/buffer-format.rst).
//!
//! Each entry is a 110-byte ASCII header (magic `070701` and 13 fields of 8 hex digits), the
//! NUL-terminated name padded to 4 bytes, then the data padded to 4 bytes. The archive ends with
//! an entry named `TRAILER!!!`. The kernel accepts several archives one after the other, which
//! is how a per-run script is appended to the cached image.

use std::io::{self, Write};

const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;

/// Builds a newc archive in memory, in the order entries are added.
#[derive(Debug, Default)]
pub struct CpioWriter {
    out: Vec<u8>,
    next_ino: u32,
}

impl CpioWriter {
    pub fn new() -> CpioWriter {
        CpioWriter {
            out: Vec::new(),
            // Inode 0 is the trailer's.
            next_ino: 1,
        }
    }

    /// A directory. Parents must be added before their children.
    pub fn dir(&mut self, name: &str) {
        self.entry(name, S_IFDIR | 0o755, 2, (0, 0), b"");
    }

    /// A regular file with `mode` permission bits (e.g. 0o755).
    pub fn file(&mut self, name: &str, mode: u32, data: &[u8]) {
        self.entry(name, S_IFREG | mode, 1, (0, 0), data);
    }

    /// A symbolic link pointing at `target`.
    pub fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, S_IFLNK | 0o777, 1, (0, 0), target.as_bytes());
    }

    /// A character device node (e.g. /dev/console is 5:1).
    pub fn char_dev(&mut self, name: &str, mode: u32, major: u32, minor: u32) {
        self.entry(name, S_IFCHR | mode, 1, (major, minor), b"");
    }

    /// Ends the archive and returns its bytes.
    pub fn finish(mut self) -> Vec<u8> {
        self.header("TRAILER!!!", 0, 0, 1, (0, 0), 0);
        self.out
    }

    fn entry(&mut self, name: &str, mode: u32, nlink: u32, rdev: (u32, u32), data: &[u8]) {
        let ino = self.next_ino;
        self.next_ino += 1;
        let size = u32::try_from(data.len()).expect("initramfs entries are < 4 GiB");
        self.header(name, ino, mode, nlink, rdev, size);
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn header(&mut self, name: &str, ino: u32, mode: u32, nlink: u32, rdev: (u32, u32), size: u32) {
        let name = name.trim_start_matches('/');
        assert!(!name.contains('\0'), "cpio name with NUL: {name:?}");
        let namesize = u32::try_from(name.len() + 1).expect("short name");
        let fields = [
            ino, mode, 0, // uid
            0, // gid
            nlink, 0, // mtime: fixed, so the image is reproducible
            size, 0, // devmajor
            0, // devminor
            rdev.0, rdev.1, namesize, 0, // check
        ];
        let mut header = String::with_capacity(110);
        header.push_str("070701");
        for field in fields {
            header.push_str(&format!("{field:08X}"));
        }
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.out.len().is_multiple_of(4) {
            self.out.push(0);
        }
    }
}

/// Writes `bytes` to `path` atomically (a temporary file, then a rename), so that a concurrent
/// reader sees either nothing or the whole file.
pub fn write_atomically(path: &std::path::Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let mut file = std::fs::File::create(&tmp)?;
    file.write_all(bytes)?;
    file.sync_all()?;
    std::fs::rename(&tmp, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_layout_and_padding() {
        let mut w = CpioWriter::new();
        w.file("a", 0o644, b"xyz");
        let bytes = w.finish();
        assert_eq!(&bytes[..6], b"070701");
        // 110-byte header + "a\0" = 112, already aligned; 3 data bytes padded to 4.
        assert_eq!(&bytes[110..112], b"a\0");
        assert_eq!(&bytes[112..115], b"xyz");
        assert_eq!(bytes[115], 0);
        assert_eq!(&bytes[116..122], b"070701");
        assert_eq!(bytes.len() % 4, 0);
        let trailer = std::str::from_utf8(&bytes[116 + 110..116 + 120]).unwrap();
        assert_eq!(trailer, "TRAILER!!!");
    }
}
