//! The META file: ledger list and cursor states of one managed ledger,
//! replaced atomically (write `META.tmp`, fsync, rename, fsync directory),
//! so a reader — in this process or another — sees the old or the new
//! version, never a mix.
//!
//! Layout: `b"TXSM"` + `u32 LE crc32c(payload)` + `ManagedLedgerMeta`
//! protobuf. The checksum matters because META decides which segment files
//! exist: a flipped bit that still decodes as protobuf could otherwise drop
//! ledgers from the list and get their files removed as leftovers.

use super::segment::sync_dir;
use crate::error::{Error, Result};
use crate::position::Position;
use crate::proto::ManagedLedgerMeta;
use prost::Message;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

/// Version written to `ManagedLedgerMeta.format_version`.
pub const META_FORMAT_VERSION: u32 = 1;
/// Name of the metadata file in a managed ledger's directory.
pub const META_FILE: &str = "META";
const META_TMP: &str = "META.tmp";
/// First bytes of every META file.
const META_MAGIC: &[u8; 4] = b"TXSM";
/// Magic + checksum.
const META_HEADER_LEN: usize = 8;

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
    if out.len() > 240 {
        return Err(Error::invalid(format!(
            "managed ledger name {name:?} is too long ({} bytes escaped, max 240)",
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

/// Directory of managed ledger `name` under `data_dir`.
pub fn ledger_dir(data_dir: &Path, name: &str) -> Result<PathBuf> {
    Ok(data_dir.join("ledgers").join(escape_name(name)?))
}

fn corrupt_meta(path: &Path, reason: impl Into<String>) -> Error {
    Error::CorruptLedger {
        path: path.display().to_string(),
        position: Position::default(),
        offset: 0,
        reason: reason.into(),
    }
}

/// Reads META; `Ok(None)` if there is none yet.
pub fn read_meta(dir: &Path) -> Result<Option<ManagedLedgerMeta>> {
    let path = dir.join(META_FILE);
    let bytes = match fs::read(&path) {
        Ok(b) => b,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(Error::io(format!("reading {}", path.display()), &e)),
    };
    let meta =
        ManagedLedgerMeta::decode(checked_payload(&bytes).map_err(|r| corrupt_meta(&path, r))?)
            .map_err(|e| corrupt_meta(&path, format!("undecodable META: {e}")))?;
    if meta.format_version != META_FORMAT_VERSION {
        return Err(corrupt_meta(
            &path,
            format!("unsupported META format_version {}", meta.format_version),
        ));
    }
    Ok(Some(meta))
}

/// The protobuf payload of a META file, after checking magic and checksum.
fn checked_payload(bytes: &[u8]) -> std::result::Result<&[u8], String> {
    if bytes.len() < META_HEADER_LEN || &bytes[..4] != META_MAGIC {
        return Err(format!(
            "not a txnstream META file (bad magic or only {} bytes)",
            bytes.len()
        ));
    }
    let stored = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
    let payload = &bytes[META_HEADER_LEN..];
    let actual = crc32c::crc32c(payload);
    if stored != actual {
        return Err(format!(
            "META checksum mismatch (stored {stored:#010x}, computed {actual:#010x})"
        ));
    }
    Ok(payload)
}

/// Replaces META atomically and durably.
pub fn write_meta(dir: &Path, meta: &ManagedLedgerMeta) -> Result<()> {
    let tmp = dir.join(META_TMP);
    let dst = dir.join(META_FILE);
    let ctx = |what: &str| format!("{what} {}", tmp.display());
    let mut f = File::create(&tmp).map_err(|e| Error::io(ctx("creating"), &e))?;
    let payload = meta.encode_to_vec();
    let mut bytes = Vec::with_capacity(META_HEADER_LEN + payload.len());
    bytes.extend_from_slice(META_MAGIC);
    bytes.extend_from_slice(&crc32c::crc32c(&payload).to_le_bytes());
    bytes.extend_from_slice(&payload);
    f.write_all(&bytes)
        .map_err(|e| Error::io(ctx("writing"), &e))?;
    f.sync_all().map_err(|e| Error::io(ctx("syncing"), &e))?;
    drop(f);
    fs::rename(&tmp, &dst).map_err(|e| Error::io(ctx("renaming"), &e))?;
    sync_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meta_checksum_detects_every_single_bit_flip() {
        let dir = tempfile::tempdir().unwrap();
        let meta = ManagedLedgerMeta {
            format_version: META_FORMAT_VERSION,
            next_ledger_id: Some(7),
            ..Default::default()
        };
        write_meta(dir.path(), &meta).unwrap();
        assert_eq!(read_meta(dir.path()).unwrap(), Some(meta));
        let good = fs::read(dir.path().join(META_FILE)).unwrap();
        for bit in 0..good.len() * 8 {
            let mut bad = good.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            fs::write(dir.path().join(META_FILE), &bad).unwrap();
            assert!(
                matches!(read_meta(dir.path()), Err(Error::CorruptLedger { .. })),
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
