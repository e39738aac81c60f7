//! Topic entries in Pulsar's format: message metadata, batches and
//! transaction markers (SPEC §3.2, §4.5).
//!
//! Layout of one entry (Pulsar `Commands.serializeMetadataAndPayload`,
//! crc32c flavour):
//!
//! ```text
//! [u16 BE 0x0e01][u32 BE crc32c][u32 BE metadata_size][MessageMetadata][payload]
//! ```
//!
//! The crc covers `metadata_size`, the metadata and the payload (not the
//! magic, not the crc field). A batch of N messages (`send_many`) is one
//! entry whose metadata says `num_messages_in_batch = N` and whose payload
//! is N times `[u32 BE size][SingleMessageMetadata][payload]`; the outer
//! `sequence_id` is the first message's and `highest_sequence_id` the last
//! one's. A transaction marker is an entry with `marker_type` = TXN_COMMIT
//! (21) or TXN_ABORT (22), producer `pulsar.txn.marker`, sequence id
//! `2^64 - 1` (Java's -1), the transaction id and an empty payload.
//!
//! (PIP-160 batched *log* entries also start with `0x0E01`, but they live in
//! transaction and pending-ack logs, never in topics.)
//!
//! Decoding checks the magic, the sizes and the checksum; anything that does
//! not add up is a [`Error::CorruptEntry`] with the byte offset (the caller
//! attaches the position), never a panic and never a silent skip.

use crate::error::{Error, Result};
use crate::proto::{KeyValue, MessageMetadata, SingleMessageMetadata};
use prost::Message as _;

/// First two bytes of a topic entry (Pulsar's crc32c magic).
pub const MAGIC_CRC32C: u16 = 0x0e01;
/// Producer name Pulsar gives its transaction markers.
pub const TXN_MARKER_PRODUCER: &str = "pulsar.txn.marker";
/// `MarkerType.TXN_COMMITTING` (defined by Pulsar, never written).
pub const MARKER_TXN_COMMITTING: i32 = 20;
/// `MarkerType.TXN_COMMIT`.
pub const MARKER_TXN_COMMIT: i32 = 21;
/// `MarkerType.TXN_ABORT`.
pub const MARKER_TXN_ABORT: i32 = 22;
/// Sequence id of a marker (Java's `-1L`).
pub const MARKER_SEQUENCE_ID: u64 = u64::MAX;
/// Bytes before the metadata: magic, crc, metadata size.
pub const HEADER_LEN: usize = 10;
/// Most messages one batch entry may hold (bounds what a decoder allocates).
pub const MAX_BATCH_MESSAGES: usize = 1 << 20;

/// One message to encode.
#[derive(Debug, Clone, Copy)]
pub struct OutMessage<'a> {
    /// The payload.
    pub payload: &'a [u8],
    /// `partition_key`, if any.
    pub key: Option<&'a str>,
    /// `properties` as `(key, value)` pairs.
    pub properties: &'a [(String, String)],
    /// The producer's sequence id of this message.
    pub sequence_id: u64,
}

/// What the metadata of every message of one entry shares.
#[derive(Debug, Clone, Copy)]
pub struct Header<'a> {
    /// The producer's name.
    pub producer_name: &'a str,
    /// Milliseconds since the epoch.
    pub publish_time: u64,
    /// `(most_bits, least_bits)` of the transaction, if sent in one.
    pub txn: Option<(u64, u64)>,
}

fn key_values(props: &[(String, String)]) -> Vec<KeyValue> {
    props
        .iter()
        .map(|(k, v)| KeyValue {
            key: k.clone(),
            value: v.clone(),
        })
        .collect()
}

fn metadata(h: &Header<'_>, sequence_id: u64) -> MessageMetadata {
    MessageMetadata {
        producer_name: h.producer_name.to_owned(),
        sequence_id,
        publish_time: h.publish_time,
        txnid_most_bits: h.txn.map(|t| t.0),
        txnid_least_bits: h.txn.map(|t| t.1),
        ..MessageMetadata::default()
    }
}

/// Frames `meta` and `payload` into one entry (magic, crc32c, size).
pub fn frame(meta: &MessageMetadata, payload: &[u8]) -> Vec<u8> {
    let meta_len = meta.encoded_len();
    let mut out = Vec::with_capacity(HEADER_LEN + meta_len + payload.len());
    out.extend_from_slice(&MAGIC_CRC32C.to_be_bytes());
    out.extend_from_slice(&[0; 4]);
    out.extend_from_slice(&(meta_len as u32).to_be_bytes());
    // Encoding into a Vec with enough room cannot fail.
    let _ = meta.encode(&mut out);
    out.extend_from_slice(payload);
    let crc = crc32c::crc32c(&out[6..]);
    out[2..6].copy_from_slice(&crc.to_be_bytes());
    out
}

/// One message in its own entry.
pub fn encode_message(h: &Header<'_>, m: &OutMessage<'_>) -> Vec<u8> {
    let mut meta = metadata(h, m.sequence_id);
    meta.partition_key = m.key.map(str::to_owned);
    meta.properties = key_values(m.properties);
    frame(&meta, m.payload)
}

/// Many messages in one batched entry (Pulsar's batch format). Empty
/// `messages` is an `InvalidArgument`.
pub fn encode_batch(h: &Header<'_>, messages: &[OutMessage<'_>]) -> Result<Vec<u8>> {
    let (Some(first), Some(last)) = (messages.first(), messages.last()) else {
        return Err(Error::invalid("a batch needs at least one message"));
    };
    if messages.len() > MAX_BATCH_MESSAGES {
        return Err(Error::invalid(format!(
            "a batch holds at most {MAX_BATCH_MESSAGES} messages, got {}",
            messages.len()
        )));
    }
    let mut payload = Vec::new();
    for m in messages {
        let size = i32::try_from(m.payload.len())
            .map_err(|_| Error::invalid("a message payload exceeds 2 GiB"))?;
        let single = SingleMessageMetadata {
            properties: key_values(m.properties),
            partition_key: m.key.map(str::to_owned),
            payload_size: size,
            sequence_id: Some(m.sequence_id),
            ..SingleMessageMetadata::default()
        };
        payload.extend_from_slice(&(single.encoded_len() as u32).to_be_bytes());
        let _ = single.encode(&mut payload);
        payload.extend_from_slice(m.payload);
    }
    let mut meta = metadata(h, first.sequence_id);
    meta.num_messages_in_batch = Some(messages.len() as i32);
    meta.highest_sequence_id = Some(last.sequence_id);
    Ok(frame(&meta, &payload))
}

/// A COMMIT (`commit`) or ABORT marker of transaction `txn`.
pub fn encode_marker(commit: bool, txn: (u64, u64), publish_time: u64) -> Vec<u8> {
    let meta = MessageMetadata {
        producer_name: TXN_MARKER_PRODUCER.to_owned(),
        sequence_id: MARKER_SEQUENCE_ID,
        publish_time,
        marker_type: Some(if commit {
            MARKER_TXN_COMMIT
        } else {
            MARKER_TXN_ABORT
        }),
        txnid_most_bits: Some(txn.0),
        txnid_least_bits: Some(txn.1),
        ..MessageMetadata::default()
    };
    frame(&meta, &[])
}

fn be_u32(b: &[u8], at: usize, what: &str) -> Result<u32> {
    b.get(at..at + 4)
        .and_then(|s| <[u8; 4]>::try_from(s).ok())
        .map(u32::from_be_bytes)
        .ok_or_else(|| Error::corrupt_entry(at, format!("truncated {what}")))
}

/// Checks the frame and returns the metadata and where the payload starts.
pub fn unframe(entry: &[u8]) -> Result<(MessageMetadata, usize)> {
    if entry.len() < HEADER_LEN {
        return Err(Error::corrupt_entry(
            0,
            format!(
                "topic entry of {} bytes is shorter than its {HEADER_LEN}-byte header",
                entry.len()
            ),
        ));
    }
    let magic = u16::from_be_bytes([entry[0], entry[1]]);
    if magic != MAGIC_CRC32C {
        return Err(Error::corrupt_entry(
            0,
            format!("topic entry starts with 0x{magic:04x}, not the magic 0x{MAGIC_CRC32C:04x}"),
        ));
    }
    let crc = be_u32(entry, 2, "checksum")?;
    let actual = crc32c::crc32c(&entry[6..]);
    if crc != actual {
        return Err(Error::corrupt_entry(
            2,
            format!("checksum mismatch: stored 0x{crc:08x}, computed 0x{actual:08x}"),
        ));
    }
    let meta_len = be_u32(entry, 6, "metadata size")? as usize;
    let end = HEADER_LEN
        .checked_add(meta_len)
        .filter(|&e| e <= entry.len())
        .ok_or_else(|| {
            Error::corrupt_entry(
                6,
                format!(
                    "metadata size {meta_len} exceeds the {} bytes after the header",
                    entry.len() - HEADER_LEN
                ),
            )
        })?;
    let meta = MessageMetadata::decode(&entry[HEADER_LEN..end])
        .map_err(|e| Error::corrupt_entry(HEADER_LEN, format!("malformed MessageMetadata: {e}")))?;
    Ok((meta, end))
}

/// One message of a decoded entry; `payload` is a range of the entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedMessage {
    /// Index in the batch (0 for an unbatched entry).
    pub batch_index: u32,
    /// Byte range of the payload within the entry.
    pub payload: std::ops::Range<usize>,
    /// `partition_key`.
    pub key: Option<String>,
    /// `properties`.
    pub properties: Vec<(String, String)>,
    /// The message's sequence id.
    pub sequence_id: u64,
}

/// A decoded topic entry: its metadata and its messages.
#[derive(Debug, Clone, PartialEq)]
pub struct DecodedEntry {
    /// The entry's metadata.
    pub meta: MessageMetadata,
    /// Messages (none for a marker), in batch-index order.
    pub messages: Vec<DecodedMessage>,
    /// `num_messages_in_batch` as written (1 for a single message).
    pub batch_size: u32,
    /// True if written as a batch (even of one message).
    pub batched: bool,
}

impl DecodedEntry {
    /// The transaction that wrote it, if any.
    pub fn txn(&self) -> Option<(u64, u64)> {
        txn_of(&self.meta)
    }

    /// The marker type, if it is a marker.
    pub fn marker(&self) -> Option<i32> {
        self.meta.marker_type
    }
}

/// `(most_bits, least_bits)` if both are present.
pub fn txn_of(meta: &MessageMetadata) -> Option<(u64, u64)> {
    match (meta.txnid_most_bits, meta.txnid_least_bits) {
        (Some(m), Some(l)) => Some((m, l)),
        _ => None,
    }
}

/// The metadata only (markers, transaction ids and sequence ids for the
/// transaction buffer and deduplication), without decoding the messages.
pub fn peek(entry: &[u8]) -> Result<MessageMetadata> {
    unframe(entry).map(|(m, _)| m)
}

/// Decodes an entry: metadata and every message (batches split).
pub fn decode(entry: &[u8]) -> Result<DecodedEntry> {
    let (meta, start) = unframe(entry)?;
    if meta.marker_type.is_some() {
        return Ok(DecodedEntry {
            meta,
            messages: Vec::new(),
            batch_size: 1,
            batched: false,
        });
    }
    let Some(n) = meta.num_messages_in_batch.filter(|_| is_batch(&meta)) else {
        let m = DecodedMessage {
            batch_index: 0,
            payload: start..entry.len(),
            key: meta.partition_key.clone(),
            properties: meta
                .properties
                .iter()
                .map(|kv| (kv.key.clone(), kv.value.clone()))
                .collect(),
            sequence_id: meta.sequence_id,
        };
        return Ok(DecodedEntry {
            meta,
            messages: vec![m],
            batch_size: 1,
            batched: false,
        });
    };
    let n = usize::try_from(n)
        .ok()
        .filter(|&n| (1..=MAX_BATCH_MESSAGES).contains(&n))
        .ok_or_else(|| {
            Error::corrupt_entry(
                HEADER_LEN,
                format!("num_messages_in_batch {n} out of range"),
            )
        })?;
    let mut messages = Vec::with_capacity(n.min(4096));
    let mut at = start;
    for i in 0..n {
        let size = be_u32(entry, at, "single message metadata size")? as usize;
        let meta_start = at + 4;
        let meta_end = meta_start
            .checked_add(size)
            .filter(|&e| e <= entry.len())
            .ok_or_else(|| {
                Error::corrupt_entry(at, format!("message {i}: metadata size {size} too large"))
            })?;
        let single = SingleMessageMetadata::decode(&entry[meta_start..meta_end]).map_err(|e| {
            Error::corrupt_entry(
                meta_start,
                format!("message {i}: malformed SingleMessageMetadata: {e}"),
            )
        })?;
        let psize = usize::try_from(single.payload_size).map_err(|_| {
            Error::corrupt_entry(
                meta_start,
                format!("message {i}: negative payload size {}", single.payload_size),
            )
        })?;
        let pend = meta_end
            .checked_add(psize)
            .filter(|&e| e <= entry.len())
            .ok_or_else(|| {
                Error::corrupt_entry(
                    meta_end,
                    format!("message {i}: payload of {psize} bytes runs past the entry"),
                )
            })?;
        messages.push(DecodedMessage {
            batch_index: i as u32,
            payload: meta_end..pend,
            key: single.partition_key,
            properties: single
                .properties
                .into_iter()
                .map(|kv| (kv.key, kv.value))
                .collect(),
            sequence_id: single
                .sequence_id
                .unwrap_or_else(|| meta.sequence_id.saturating_add(i as u64)),
        });
        at = pend;
    }
    if at != entry.len() {
        return Err(Error::corrupt_entry(
            at,
            format!(
                "{} bytes after the last of {n} batched messages",
                entry.len() - at
            ),
        ));
    }
    Ok(DecodedEntry {
        meta,
        messages,
        batch_size: n as u32,
        batched: true,
    })
}

/// Pulsar marks a batch by setting `num_messages_in_batch` (a single
/// message leaves it unset); a batch of one sets it to 1.
fn is_batch(meta: &MessageMetadata) -> bool {
    meta.num_messages_in_batch.is_some()
}

/// The highest sequence id an entry carries (batches: the last message's).
pub fn highest_sequence_id(meta: &MessageMetadata) -> u64 {
    meta.highest_sequence_id
        .filter(|&h| h >= meta.sequence_id)
        .unwrap_or(meta.sequence_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header(txn: Option<(u64, u64)>) -> Header<'static> {
        Header {
            producer_name: "p",
            publish_time: 7,
            txn,
        }
    }

    #[test]
    fn single_roundtrip_with_key_properties_and_txn() {
        let props = vec![("a".to_owned(), "b".to_owned())];
        let m = OutMessage {
            payload: b"hello",
            key: Some("k"),
            properties: &props,
            sequence_id: 42,
        };
        let e = encode_message(&header(Some((1, 9))), &m);
        assert_eq!(&e[..2], &[0x0e, 0x01]);
        let d = decode(&e).expect("decodes");
        assert_eq!(d.txn(), Some((1, 9)));
        assert_eq!(d.messages.len(), 1);
        assert_eq!(&e[d.messages[0].payload.clone()], b"hello");
        assert_eq!(d.messages[0].key.as_deref(), Some("k"));
        assert_eq!(d.messages[0].properties, props);
        assert_eq!(d.messages[0].sequence_id, 42);
        assert!(!d.batched);
    }

    #[test]
    fn batch_roundtrip() {
        let none: Vec<(String, String)> = Vec::new();
        let ms: Vec<OutMessage<'_>> = (0..3u64)
            .map(|i| OutMessage {
                payload: if i == 1 { b"" } else { b"xy" },
                key: None,
                properties: &none,
                sequence_id: 10 + i,
            })
            .collect();
        let e = encode_batch(&header(None), &ms).expect("encodes");
        let d = decode(&e).expect("decodes");
        assert_eq!(d.batch_size, 3);
        assert_eq!(d.meta.sequence_id, 10);
        assert_eq!(highest_sequence_id(&d.meta), 12);
        let seqs: Vec<u64> = d.messages.iter().map(|m| m.sequence_id).collect();
        assert_eq!(seqs, vec![10, 11, 12]);
        assert_eq!(&e[d.messages[1].payload.clone()], b"");
        assert!(encode_batch(&header(None), &[]).is_err());
    }

    #[test]
    fn marker_has_pulsar_numbers() {
        let e = encode_marker(false, (3, 4), 5);
        let d = decode(&e).expect("decodes");
        assert_eq!(d.marker(), Some(22));
        assert_eq!(d.meta.producer_name, TXN_MARKER_PRODUCER);
        assert_eq!(d.meta.sequence_id, u64::MAX);
        assert!(d.messages.is_empty());
        assert_eq!(
            decode(&encode_marker(true, (3, 4), 5))
                .expect("decodes")
                .marker(),
            Some(21)
        );
    }

    #[test]
    fn damage_is_a_corrupt_entry_never_a_panic() {
        let none: Vec<(String, String)> = Vec::new();
        let m = OutMessage {
            payload: b"payload",
            key: None,
            properties: &none,
            sequence_id: 1,
        };
        let e = encode_message(&header(None), &m);
        for cut in 0..e.len() {
            assert!(decode(&e[..cut]).is_err(), "truncated at {cut}");
        }
        for i in 0..e.len() {
            for bit in 0..8 {
                let mut d = e.clone();
                d[i] ^= 1 << bit;
                assert!(decode(&d).is_err(), "flip at byte {i} bit {bit}");
            }
        }
    }
}
