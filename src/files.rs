//! Reading the small files an operator names (token, TLS, `-f` lists,
//! haproxy configurations): only regular files, and only up to a limit.
//!
//! In: a path and the most bytes the file may hold. Out: its bytes, or one
//! line saying why not.
//!
//! Always holds:
//! - a FIFO, a device (`/dev/zero`), a socket or a directory is refused
//!   without blocking (opened with `O_NONBLOCK`, checked with `fstat` on
//!   the descriptor read, so the file checked is the file read);
//! - at most `max + 1` bytes are ever read, so a file growing under us
//!   cannot exhaust memory either.

use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// A token file holds one token.
pub const MAX_TOKEN_BYTES: u64 = 64 * 1024;
/// A PEM bundle of CAs (the system's is about 200 KiB).
pub const MAX_PEM_BYTES: u64 = 4 * 1024 * 1024;
/// An haproxy configuration or a `-f` list.
pub const MAX_CONFIG_BYTES: u64 = 16 * 1024 * 1024;

/// The bytes of the regular file at `path`, at most `max` of them; the
/// error says why not (the caller names the file).
pub fn read_regular(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .map_err(|e| e.to_string())?;
    let meta = file.metadata().map_err(|e| e.to_string())?;
    if !meta.is_file() {
        return Err(
            "not a regular file (a FIFO, device, socket or directory is not read)".to_owned(),
        );
    }
    if meta.len() > max {
        return Err(format!("{} bytes, more than {max}", meta.len()));
    }
    let mut bytes = Vec::with_capacity(meta.len() as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| e.to_string())?;
    if bytes.len() as u64 > max {
        return Err(format!("more than {max} bytes"));
    }
    Ok(bytes)
}

/// The permission bits of `path` when others than its owner's group may
/// read or write it (`o+r`, `o+w`, or `g+w`): a secret there is not kept.
pub fn loose_mode(path: &Path) -> Option<u32> {
    let mode = std::fs::metadata(path).ok()?.permissions().mode() & 0o777;
    (mode & 0o026 != 0).then_some(mode)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(tag: &str) -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("gha-files-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn a_regular_file_is_read_up_to_its_limit() {
        let d = dir("limit");
        let f = d.join("t");
        std::fs::write(&f, b"secret\n").unwrap();
        assert_eq!(read_regular(&f, 7).unwrap(), b"secret\n");
        let e = read_regular(&f, 6).unwrap_err();
        assert!(e.contains("7 bytes, more than 6"), "{e}");
        std::fs::remove_dir_all(&d).unwrap();
    }

    /// Issue 39: `/dev/zero` as a token file ran out of memory, a FIFO
    /// blocked start-up.
    #[test]
    fn devices_fifos_and_directories_are_refused_at_once() {
        let d = dir("kinds");
        let fifo = d.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: mkfifo with a valid NUL-terminated path.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t = std::time::Instant::now();
        for p in [Path::new("/dev/zero"), &fifo, &d] {
            let e = read_regular(p, MAX_TOKEN_BYTES).unwrap_err();
            assert!(e.contains("not a regular file"), "{e}");
        }
        assert!(t.elapsed() < std::time::Duration::from_secs(1));
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn a_mode_others_can_read_or_write_is_named() {
        let d = dir("mode");
        let f = d.join("t");
        std::fs::write(&f, b"x").unwrap();
        for (mode, loose) in [
            (0o600, None),
            (0o640, None),
            (0o644, Some(0o644)),
            (0o660, Some(0o660)),
            (0o602, Some(0o602)),
        ] {
            std::fs::set_permissions(&f, std::fs::Permissions::from_mode(mode)).unwrap();
            assert_eq!(loose_mode(&f), loose, "{mode:o}");
        }
        std::fs::remove_dir_all(&d).unwrap();
    }
}
