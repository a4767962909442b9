//! The buffer every list body is written into: items separated by commas after room left for
//! the list's head, which is known only after the last item (its continue token and
//! remainingItemCount) and goes into that room, ending where the first item starts. JSON lists
//! ([`crate::render::list_body`]) and Tables ([`crate::render::table`]) are both written this way.

use bytes::{Buf, Bytes};

/// Room for a head beyond what the caller knows it needs up front: metadata with a continue
/// token fits in ~0.8 KB even for 253-character names. A longer head still works, at the cost
/// of copying the items once more.
pub const METADATA_ROOM: usize = 1024;

/// How much of a streamed list is written before it is handed to the connection: large enough
/// that a piece costs one store seek per ~150 objects, small enough that a 10,000-object list
/// holds 64 KiB at a time rather than megabytes.
pub const STREAM_PIECE: usize = 64 * 1024;

/// HTTP/2's default (and Go's and curl's) DATA frame size: streamed pieces are cut at a multiple.
pub const FRAME_BYTES: usize = 16 * 1024;

/// Items separated by commas, after room for the head.
pub struct ListBody {
    out: Vec<u8>,
    room: usize,
    /// How many items are coming, when known: the first one sizes the buffer for all.
    expected: usize,
    items: usize,
}

impl ListBody {
    /// An empty body with `room` bytes for the head; `expected`, the number of items when
    /// known, sizes the buffer once the first item is written.
    pub fn new(room: usize, expected: Option<usize>) -> Self {
        let mut out = Vec::with_capacity(room + 4096);
        out.resize(room, b' ');
        Self {
            out,
            room,
            expected: expected.unwrap_or(0),
            items: 0,
        }
    }

    /// The buffer to append the next item to, its separating comma written.
    pub fn next_item(&mut self) -> &mut Vec<u8> {
        if self.items == 1 {
            // Objects of one kind are alike in size: a quarter more than the first one's
            // absorbs the spread, and a larger list grows the buffer once.
            let per_item = self.out.len() - self.room + 1;
            let rest = self.expected.saturating_sub(1);
            self.out
                .reserve(rest.saturating_mul(per_item + per_item / 4));
        }
        if self.items > 0 {
            self.out.push(b',');
        }
        self.items += 1;
        &mut self.out
    }

    /// Bytes of items written and not yet taken.
    pub fn pending(&self) -> usize {
        self.out.len() - self.room
    }

    /// `head` and the items so far: the first piece of a streamed list. The next items go to
    /// a fresh buffer.
    pub fn take_first(&mut self, head: &[u8]) -> Bytes {
        let out = std::mem::take(&mut self.out);
        let room = std::mem::take(&mut self.room);
        let first = place_head(out, room, head);
        self.cut_piece(first)
    }

    /// The items written since the last piece was taken.
    pub fn take(&mut self) -> Bytes {
        let written = Bytes::from(std::mem::take(&mut self.out));
        self.cut_piece(written)
    }

    /// Whole HTTP/2 DATA frames of `written`; the bytes after the last whole frame start the
    /// next piece. (A piece ending in a short frame costs an extra frame and TLS record each
    /// time: with 64 KiB pieces, about 5% of a list of 10,000 objects' CPU, measured serially.)
    fn cut_piece(&mut self, mut written: Bytes) -> Bytes {
        let cut = written.len() / FRAME_BYTES * FRAME_BYTES;
        self.out = Self::piece_buffer();
        self.out.extend_from_slice(&written[cut..]);
        written.truncate(cut);
        written
    }

    fn piece_buffer() -> Vec<u8> {
        // A piece ends with the item that crosses STREAM_PIECE.
        Vec::with_capacity(STREAM_PIECE + STREAM_PIECE / 4)
    }

    /// The last piece of a streamed list: the items since the last piece, then `tail`.
    pub fn take_last(&mut self, tail: &[u8]) -> Bytes {
        let mut out = std::mem::take(&mut self.out);
        out.extend_from_slice(tail);
        Bytes::from(out)
    }

    /// `head`, the items, then `tail`.
    pub fn finish(self, head: &[u8], tail: &[u8]) -> Bytes {
        let mut out = self.out;
        out.extend_from_slice(tail);
        place_head(out, self.room, head)
    }
}

/// Puts `head` into the room before the items, or copies both apart when it does not fit.
fn place_head(mut out: Vec<u8>, room: usize, head: &[u8]) -> Bytes {
    let Some(start) = room.checked_sub(head.len()) else {
        let mut whole = Vec::with_capacity(head.len() + out.len() - room);
        whole.extend_from_slice(head);
        whole.extend_from_slice(&out[room..]);
        return Bytes::from(whole);
    };
    out[start..room].copy_from_slice(head);
    let mut body = Bytes::from(out);
    body.advance(start);
    body
}
