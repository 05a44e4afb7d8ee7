//! Opening files strictly beneath the document root.
//!
//! Every open goes through `openat2(2)` with `RESOLVE_BENEATH`, relative
//! to a directory descriptor of the root: the kernel itself refuses any
//! path, `..` or symlink (absolute or relative) that would leave the root,
//! whatever a request target looked like. `O_NONBLOCK` keeps a FIFO in the
//! root from stalling a worker, and anything that is not a regular file or
//! directory is treated as absent.

use std::fs::File;
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::time::SystemTime;

use nix::errno::Errno;
use nix::fcntl::{openat2, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::Mode;

use switchyard_http::conditional::{http_date, make_etag};
use switchyard_http::response::content_type;

/// A directory descriptor for the document root.
#[derive(Debug)]
pub struct Root {
    dir: OwnedFd,
}

/// What the node knows about a file it serves.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FileInfo {
    pub len: u64,
    pub inode: u64,
    pub mtime: SystemTime,
    pub etag: String,
    pub last_modified: String,
    pub content_type: &'static str,
}

/// The result of looking a path up beneath the root.
#[derive(Debug)]
pub enum Lookup {
    File(File, FileInfo),
    Directory,
    NotFound,
    Forbidden,
}

impl Root {
    /// Open the root directory.
    pub fn open(path: &Path) -> io::Result<Root> {
        let file = File::open(path)?;
        if !file.metadata()?.is_dir() {
            return Err(io::Error::new(
                io::ErrorKind::NotADirectory,
                format!("{} is not a directory", path.display()),
            ));
        }
        Ok(Root { dir: file.into() })
    }

    /// The root directory's descriptor.
    pub fn fd(&self) -> std::os::fd::BorrowedFd<'_> {
        self.dir.as_fd()
    }

    /// Look up `rel` (a normalized relative path, empty for the root).
    pub fn lookup(&self, rel: &str) -> Lookup {
        let rel = if rel.is_empty() { "." } else { rel };
        let how = OpenHow::new()
            .flags(OFlag::O_RDONLY | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK | OFlag::O_NOCTTY)
            .mode(Mode::empty())
            .resolve(ResolveFlag::RESOLVE_BENEATH | ResolveFlag::RESOLVE_NO_MAGICLINKS);
        let fd = match openat2(self.dir.as_fd(), rel, how) {
            Ok(fd) => fd,
            Err(Errno::EACCES | Errno::EPERM) => return Lookup::Forbidden,
            // ENOENT, ENOTDIR, EXDEV (escape attempt), ELOOP, ENAMETOOLONG…
            Err(_) => return Lookup::NotFound,
        };
        let file = File::from(fd);
        let meta = match file.metadata() {
            Ok(m) => m,
            Err(_) => return Lookup::NotFound,
        };
        if meta.is_dir() {
            return Lookup::Directory;
        }
        if !meta.is_file() {
            return Lookup::NotFound;
        }
        let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
        let info = FileInfo {
            len: meta.len(),
            inode: meta.ino(),
            mtime,
            etag: make_etag(meta.ino(), meta.len(), mtime),
            last_modified: http_date(mtime),
            content_type: content_type(rel),
        };
        Lookup::File(file, info)
    }
}

/// Read a whole file of known length.
pub fn read_all(file: &File, len: u64) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len as usize];
    let mut off = 0usize;
    while off < buf.len() {
        let n = file.read_at(&mut buf[off..], off as u64)?;
        if n == 0 {
            // The file shrank under us; serve what is there is wrong, so fail.
            return Err(io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "file shrank while reading",
            ));
        }
        off += n;
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn stays_beneath_root() {
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), b"s").unwrap();
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("a.txt"), b"hello").unwrap();
        std::fs::create_dir(dir.path().join("sub")).unwrap();
        symlink(outside.path().join("secret"), dir.path().join("abs-link")).unwrap();
        symlink("../../../../../../etc/passwd", dir.path().join("rel-link")).unwrap();
        symlink("a.txt", dir.path().join("ok-link")).unwrap();
        let root = Root::open(dir.path()).unwrap();
        match root.lookup("a.txt") {
            Lookup::File(f, info) => {
                assert_eq!(info.len, 5);
                assert_eq!(info.content_type, "text/plain; charset=utf-8");
                assert_eq!(read_all(&f, info.len).unwrap(), b"hello");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(root.lookup("sub"), Lookup::Directory));
        assert!(matches!(root.lookup(""), Lookup::Directory));
        assert!(matches!(root.lookup("abs-link"), Lookup::NotFound));
        assert!(matches!(root.lookup("rel-link"), Lookup::NotFound));
        assert!(matches!(root.lookup("../x"), Lookup::NotFound));
        assert!(matches!(root.lookup("ok-link"), Lookup::File(..)));
        assert!(matches!(root.lookup("missing"), Lookup::NotFound));
    }
}
