//! The CATALOG of a data directory: the state of every managed ledger
//! (ledgers, cursors) as of a journal offset, the checkpoint. Recovery loads
//! it and replays the journal from there. Replaced atomically (write
//! `CATALOG.tmp`, fsync, rename, fsync the directory), so a reader — in this
//! process or another — sees the old or the new version, never a mix.
//!
//! Layout: `b"TXSC"` + `u32 LE crc32c(payload)` + `Catalog` protobuf. The
//! checksum matters because the catalog decides which ledger files exist: a
//! flipped bit that still decodes could otherwise drop ledgers from the list.

use super::fs::{Fs, OpenMode};
use crate::error::{Error, Result};
use crate::position::Position;
use crate::proto::Catalog;
use prost::Message;
use std::io;
use std::path::{Path, PathBuf};

/// Version written to `Catalog.format_version` (storage format 2: one
/// journal per data directory).
pub const CATALOG_FORMAT_VERSION: u32 = 2;
/// Name of the catalog file in a data directory.
pub const CATALOG_FILE: &str = "CATALOG";
const CATALOG_TMP: &str = "CATALOG.tmp";
/// First bytes of every catalog file.
const CATALOG_MAGIC: &[u8; 4] = b"TXSC";
/// Magic + checksum.
const CATALOG_HEADER_LEN: usize = 8;

/// Turns a managed-ledger name into one path component, reversibly:
/// `%`, `/` and a leading `.` are percent-encoded.
pub fn escape_name(name: &str) -> Result<String> {
    if name.is_empty() {
        return Err(Error::invalid("managed ledger name must not be empty"));
    }
    if name.contains('\0') {
        return Err(Error::invalid(format!(
            "managed ledger name {name:?} contains a NUL byte"
        )));
    }
    let mut out = String::with_capacity(name.len());
    for (i, c) in name.chars().enumerate() {
        match c {
            '%' => out.push_str("%25"),
            '/' => out.push_str("%2F"),
            // "." and ".." must not name the directory itself or its parent.
            '.' if i == 0 => out.push_str("%2E"),
            c => out.push(c),
        }
    }
    // Leaves room for "@<20 digits>.log" in a 255-byte file name.
    if out.len() > 224 {
        return Err(Error::invalid(format!(
            "managed ledger name {name:?} is too long ({} bytes escaped, max 224)",
            out.len()
        )));
    }
    Ok(out)
}

/// Inverse of [`escape_name`].
pub fn unescape_name(escaped: &str) -> Option<String> {
    let mut out = Vec::with_capacity(escaped.len());
    let b = escaped.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = escaped.get(i + 1..i + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Path prefix of managed ledger `name`'s files under `data_dir`:
/// `<data_dir>/ledgers/<escaped name>` (see [`super::ledger_file::log_path`]).
pub fn ledger_prefix(data_dir: &Path, name: &str) -> Result<PathBuf> {
    Ok(data_dir.join("ledgers").join(escape_name(name)?))
}

fn corrupt_catalog(path: &Path, reason: impl Into<String>) -> Error {
    Error::CorruptLedger {
        path: path.display().to_string(),
        position: Position::default(),
        offset: 0,
        reason: reason.into(),
    }
}

/// Reads the catalog of `data_dir`; `Ok(None)` if there is none yet.
pub fn read_catalog(fs: &dyn Fs, data_dir: &Path) -> Result<Option<Catalog>> {
    let path = data_dir.join(CATALOG_FILE);
    let bytes = match fs.read_file(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), &e)),
    };
    decode_catalog(&path, &bytes).map(Some)
}

/// Decodes catalog bytes read from `path`.
pub fn decode_catalog(path: &Path, bytes: &[u8]) -> Result<Catalog> {
    let cat = Catalog::decode(checked_payload(bytes).map_err(|r| corrupt_catalog(path, r))?)
        .map_err(|e| corrupt_catalog(path, format!("undecodable catalog: {e}")))?;
    if cat.format_version != CATALOG_FORMAT_VERSION {
        return Err(corrupt_catalog(
            path,
            format!(
                "unsupported storage format version {} (this build reads {CATALOG_FORMAT_VERSION})",
                cat.format_version
            ),
        ));
    }
    Ok(cat)
}

/// The protobuf payload of a catalog file, after checking magic and checksum.
fn checked_payload(bytes: &[u8]) -> std::result::Result<&[u8], String> {
    if bytes.len() < CATALOG_HEADER_LEN || &bytes[..4] != CATALOG_MAGIC {
        return Err(format!(
            "not a txnstream CATALOG file (bad magic or only {} bytes)",
            bytes.len()
        ));
    }
    let stored = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let payload = &bytes[CATALOG_HEADER_LEN..];
    let actual = crc32c::crc32c(payload);
    if stored != actual {
        return Err(format!(
            "CATALOG checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        ));
    }
    Ok(payload)
}

/// The bytes of a catalog file.
pub fn encode_catalog(cat: &Catalog) -> Vec<u8> {
    let payload = cat.encode_to_vec();
    let mut bytes = Vec::with_capacity(CATALOG_HEADER_LEN + payload.len());
    bytes.extend_from_slice(CATALOG_MAGIC);
    bytes.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    bytes.extend_from_slice(&payload);
    bytes
}

/// Replaces the catalog atomically and durably. The temporary file is
/// created anew (never through a symlink planted in its place).
pub fn write_catalog(fs: &dyn Fs, data_dir: &Path, cat: &Catalog) -> Result<()> {
    let tmp = data_dir.join(CATALOG_TMP);
    let dst = data_dir.join(CATALOG_FILE);
    let ctx = |what: &str| format!("{what} {}", tmp.display());
    match fs.remove_file(&tmp) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(ctx("removing"), &e)),
    }
    let f = fs
        .open(&tmp, OpenMode::CREATE_NEW)
        .map_err(|e| Error::io(ctx("creating"), &e))?;
    f.write_all_at(&encode_catalog(cat), 0)
        .map_err(|e| Error::io(ctx("writing"), &e))?;
    f.sync_data().map_err(|e| Error::io(ctx("syncing"), &e))?;
    drop(f);
    fs.rename(&tmp, &dst)
        .map_err(|e| Error::io(ctx("renaming"), &e))?;
    fs.sync_dir(data_dir)
        .map_err(|e| Error::io(format!("syncing directory {}", data_dir.display()), &e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn catalog_checksum_detects_every_single_bit_flip() {
        let dir = tempfile::tempdir().unwrap();
        let fs = super::super::fs::RealFs::new();
        let cat = Catalog {
            format_version: CATALOG_FORMAT_VERSION,
            checkpoint: 99,
            next_ml_id: 7,
            ledgers: Vec::new(),
            sequence: 3,
        };
        write_catalog(&fs, dir.path(), &cat).unwrap();
        assert_eq!(read_catalog(&fs, dir.path()).unwrap(), Some(cat));
        let good = std::fs::read(dir.path().join(CATALOG_FILE)).unwrap();
        for bit in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            std::fs::write(dir.path().join(CATALOG_FILE), &bad).unwrap();
            assert!(
                matches!(
                    read_catalog(&fs, dir.path()),
                    Err(Error::CorruptLedger { .. })
                ),
                "bit {bit} flip not detected"
            );
        }
    }

    #[test]
    fn escape_roundtrip() {
        for n in [
            "a",
            "public/default/out",
            "50%/x",
            ".hidden",
            "..",
            "a.b",
            "ü/%2F",
        ] {
            let e = escape_name(n).unwrap();
            assert!(!e.contains('/'));
            assert!(e != "." && e != "..");
            assert_eq!(unescape_name(&e).as_deref(), Some(n));
        }
        assert!(escape_name("").is_err());
        assert!(escape_name("a\0b").is_err());
        assert_ne!(escape_name("a/b").unwrap(), escape_name("a%2Fb").unwrap());
    }
}
