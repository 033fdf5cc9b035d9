//! The data plane's byte format: the frame reader fed in arbitrary pieces, and the handshake decoder.

use shoal_wire::{DEFAULT_MAX_FRAME_LEN, Frame};
use shoal_wire::{FrameReader, Handshake};

/// A small maximum, so the fuzzer reaches the "frame too long" path with short inputs too.
const SMALL_MAX: u32 = 4096;

/// Pushes the input into a [`FrameReader`] in the pieces [`crate::pieces`] cuts (the first byte picks
/// the maximum frame length). [`Frame::decode`] on the whole input must agree with the reader, every
/// frame read must encode to bytes that decode to the same frame, and a failed reader stays failed.
pub fn frame(data: &[u8]) {
    let Some((&pick, data)) = data.split_first() else {
        return;
    };
    let max = if pick & 1 == 0 {
        SMALL_MAX
    } else {
        DEFAULT_MAX_FRAME_LEN
    };
    let mut reader = FrameReader::new(max);
    let mut frames = Vec::new();
    let mut failed = None;
    for piece in crate::pieces(data) {
        reader.push(piece);
        loop {
            match reader.next_frame() {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => break,
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        if failed.is_some() {
            break;
        }
    }
    if let Some(e) = &failed {
        // Poisoned: the same error again, whatever comes next.
        reader.push(b"more bytes");
        assert_eq!(reader.next_frame().err().as_ref(), Some(e));
    }
    // The same bytes in one piece give the same frames (compared by their encodings: frames carry f32s,
    // and NaN is not equal to itself), and a frame's encoding decodes to a frame that encodes the same.
    let whole: Vec<u8> = crate::pieces(data).concat();
    let mut pos = 0;
    for f in &frames {
        let (again, used) = Frame::decode(&whole[pos..], max)
            .expect("a frame the reader accepted decodes again")
            .expect("a frame the reader accepted is complete");
        let bytes = f.encode().expect("a decoded frame encodes");
        assert_eq!(again.encode().expect("encodes"), bytes);
        let (back, n) = Frame::decode(&bytes, DEFAULT_MAX_FRAME_LEN)
            .expect("its own encoding decodes")
            .expect("its own encoding is complete");
        assert_eq!(n, bytes.len());
        assert_eq!(back.encode().expect("encodes"), bytes);
        pos += used;
    }
}

/// Decodes a handshake: one that decodes must encode back to the bytes it used, and agree with
/// [`Handshake::wire_len`] on its length; one compared with itself is compatible.
pub fn handshake(data: &[u8]) {
    let len = Handshake::wire_len(data);
    match Handshake::decode(data) {
        Ok((hs, used)) => {
            assert_eq!(len.ok().flatten(), Some(used), "wire_len and decode agree");
            assert_eq!(
                hs.encode(),
                data[..used],
                "a handshake encodes back to its bytes"
            );
            hs.check_compatible(&hs)
                .expect("a handshake is compatible with itself");
        }
        Err(_) => {
            // A prefix wire_len accepted as complete must not have decoded: nothing to check beyond "no panic".
        }
    }
}
