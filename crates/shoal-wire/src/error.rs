//! [`WireError`]: everything that can go wrong while encoding or decoding the data plane.

/// Errors of the wire layer. Every decode failure maps to one variant with structured fields, so
/// the caller can log it, count it by [`WireError::error_type`] and close the connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// The handshake did not start with `b"SHOL"`: the peer is not a shoal node.
    #[error("bad handshake magic {found:02x?} (expected \"SHOL\")")]
    BadMagic { found: [u8; 4] },
    /// The peer speaks another wire version.
    #[error("wire version mismatch: we speak v{ours}, peer speaks v{theirs}")]
    VersionMismatch { ours: u16, theirs: u16 },
    /// The peer belongs to another cluster (different cluster-key hash).
    #[error("cluster mismatch: peer presented a different cluster hash")]
    ClusterMismatch,
    /// The handshake body length does not match what this version defines.
    #[error("handshake body is {got} bytes, version {version} defines {expected}")]
    HandshakeLength {
        version: u16,
        expected: usize,
        got: usize,
    },
    /// Unknown role tag in the handshake.
    #[error("unknown handshake role tag {0}")]
    UnknownRole(u8),
    /// An owner's handshake with stage fields that are not zero (an owner has none; the encoding is
    /// canonical, so garbage there is refused rather than ignored).
    #[error(
        "an owner's handshake carries stage fields (stage {stage}, layers {start}..{end}): they must be zero"
    )]
    OwnerStageFields { stage: u16, start: u32, end: u32 },
    /// A group member's handshake names its own rank as the other end.
    #[error("a group member's connection from rank {rank} to itself")]
    SelfLink { rank: u32 },
    /// A stage announced a layer range with start > end.
    #[error("invalid layer range {start}..{end}")]
    LayerRange { start: u32, end: u32 },
    /// A length prefix (or an encoded frame) exceeds the configured maximum.
    #[error("frame of {len} bytes exceeds the maximum of {max} bytes")]
    FrameTooLarge { len: u64, max: u32 },
    /// A length prefix of zero: a frame needs at least its kind byte.
    #[error("empty frame (length prefix 0)")]
    EmptyFrame,
    /// The frame kind byte is not one we know.
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    /// Unknown dtype tag in an activations frame.
    #[error("unknown dtype tag {0}")]
    UnknownDType(u8),
    /// Reserved flag bits were set in a chunk header.
    #[error("reserved chunk flag bits set: {0:#04x}")]
    ReservedFlags(u8),
    /// A chunk's drafted count that its chunk cannot hold: drafts on a chunk that wants no logits,
    /// or as many as its tokens (the chunk also feeds the token before them).
    #[error("a chunk of {len} tokens cannot verify {drafted} drafted ones")]
    BadDraft { drafted: u16, len: u32 },
    /// Fewer bytes than a field or count needs.
    #[error("truncated: needed {needed} bytes, got {got}")]
    Truncated { needed: u64, got: u64 },
    /// Bytes left over inside a frame after its last field.
    #[error("{extra} trailing bytes after the frame's last field")]
    TrailingBytes { extra: usize },
    /// Activation rows do not equal the sum of the chunk lengths.
    #[error("shape mismatch: {rows} rows but chunk lengths sum to {chunk_rows}")]
    ShapeMismatch { rows: u32, chunk_rows: u64 },
    /// Activation data length is not rows * cols * dtype size.
    #[error("activation data is {got} bytes, shape and dtype need {expected}")]
    DataLength { expected: u64, got: u64 },
    /// f16 bytes of odd length.
    #[error("f16 data of odd byte length {len}")]
    OddF16Length { len: usize },
    /// An error frame message that is not UTF-8.
    #[error("error frame message is not valid UTF-8")]
    InvalidUtf8,
    /// Unknown action tag in a prefix frame.
    #[error("unknown prefix action {0}")]
    UnknownPrefixAction(u8),
}

impl WireError {
    /// A short, stable label for metrics and logs (`wire_errors_total{type="..."}`).
    pub fn error_type(&self) -> &'static str {
        match self {
            WireError::BadMagic { .. } => "bad_magic",
            WireError::VersionMismatch { .. } => "version_mismatch",
            WireError::ClusterMismatch => "cluster_mismatch",
            WireError::HandshakeLength { .. } => "handshake_length",
            WireError::UnknownRole(_) => "unknown_role",
            WireError::OwnerStageFields { .. } => "owner_stage_fields",
            WireError::SelfLink { .. } => "self_link",
            WireError::LayerRange { .. } => "layer_range",
            WireError::FrameTooLarge { .. } => "frame_too_large",
            WireError::EmptyFrame => "empty_frame",
            WireError::UnknownKind(_) => "unknown_kind",
            WireError::UnknownDType(_) => "unknown_dtype",
            WireError::ReservedFlags(_) => "reserved_flags",
            WireError::BadDraft { .. } => "bad_draft",
            WireError::Truncated { .. } => "truncated",
            WireError::TrailingBytes { .. } => "trailing_bytes",
            WireError::UnknownPrefixAction(_) => "unknown_prefix_action",
            WireError::ShapeMismatch { .. } => "shape_mismatch",
            WireError::DataLength { .. } => "data_length",
            WireError::OddF16Length { .. } => "odd_f16_length",
            WireError::InvalidUtf8 => "invalid_utf8",
        }
    }
}
