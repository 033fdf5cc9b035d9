//! The connection handshake: each side sends one [`Handshake`] before any frame, reads the
//! peer's, and calls [`Handshake::check_compatible`].

use crate::WireError;
use crate::cursor::Cursor;

/// First four bytes on every data-plane connection.
pub const MAGIC: [u8; 4] = *b"SHOL";
/// The wire version this crate speaks (4: the `Prefix` frame's rewind action; 5: tensor-parallel
/// groups — the `Member` role and the `Inputs` frame; 6: a sample job's draft to verify and the
/// masks after each drafted token, speculative decoding).
pub const WIRE_VERSION: u16 = 7;
/// Bytes before the handshake body: magic, version, body length.
pub const HANDSHAKE_HEADER_LEN: usize = 8;
/// Body length of a handshake (versions 1 to 6).
pub const HANDSHAKE_V1_BODY_LEN: usize = 83;

const ROLE_STAGE: u8 = 1;
const ROLE_OWNER: u8 = 2;
const ROLE_MEMBER: u8 = 3;

/// What the sending node is on this connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A pipeline stage running layers `layer_start..layer_end` of `instance_id`.
    Stage {
        instance_id: u64,
        stage_index: u16,
        layer_start: u32,
        layer_end: u32,
    },
    /// The node that owns requests of `instance_id` and receives their sampled tokens.
    Owner { instance_id: u64 },
    /// Rank `rank` of the tensor-parallel group computing stage `stage_index` of `instance_id`, on
    /// its connection to rank `to` (the lower rank opens; rank 0 also sends the stage's input on it).
    Member {
        instance_id: u64,
        stage_index: u16,
        rank: u32,
        to: u32,
    },
}

impl Role {
    /// The model instance this connection serves.
    pub fn instance_id(&self) -> u64 {
        match *self {
            Role::Stage { instance_id, .. }
            | Role::Owner { instance_id }
            | Role::Member { instance_id, .. } => instance_id,
        }
    }
}

/// The first message on a connection, in both directions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Handshake {
    pub magic: [u8; 4],
    pub version: u16,
    /// The sender's node id.
    pub node_id: [u8; 32],
    /// A hash of the cluster key (never the key itself).
    pub cluster: [u8; 32],
    pub role: Role,
}

impl Handshake {
    /// A handshake of the current [`WIRE_VERSION`].
    pub fn new(node_id: [u8; 32], cluster: [u8; 32], role: Role) -> Self {
        Handshake {
            magic: MAGIC,
            version: WIRE_VERSION,
            node_id,
            cluster,
            role,
        }
    }

    /// The encoded handshake (`HANDSHAKE_HEADER_LEN + HANDSHAKE_V1_BODY_LEN` bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(HANDSHAKE_HEADER_LEN + HANDSHAKE_V1_BODY_LEN);
        out.extend_from_slice(&self.magic);
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&(HANDSHAKE_V1_BODY_LEN as u16).to_le_bytes());
        out.extend_from_slice(&self.node_id);
        out.extend_from_slice(&self.cluster);
        let (tag, instance_id, stage_index, start, end) = match self.role {
            Role::Stage {
                instance_id,
                stage_index,
                layer_start,
                layer_end,
            } => (ROLE_STAGE, instance_id, stage_index, layer_start, layer_end),
            Role::Owner { instance_id } => (ROLE_OWNER, instance_id, 0, 0, 0),
            Role::Member {
                instance_id,
                stage_index,
                rank,
                to,
            } => (ROLE_MEMBER, instance_id, stage_index, rank, to),
        };
        out.push(tag);
        out.extend_from_slice(&instance_id.to_le_bytes());
        out.extend_from_slice(&stage_index.to_le_bytes());
        out.extend_from_slice(&start.to_le_bytes());
        out.extend_from_slice(&end.to_le_bytes());
        out
    }

    /// Given the first bytes read from a connection, returns the full handshake length once the
    /// 8-byte header is there (`Ok(None)` before). Fails early on bad magic, so a reader never
    /// waits for bytes a non-shoal peer will not send.
    pub fn wire_len(prefix: &[u8]) -> Result<Option<usize>, WireError> {
        if prefix.len() >= 4 && prefix[..4] != MAGIC {
            let mut found = [0u8; 4];
            found.copy_from_slice(&prefix[..4]);
            return Err(WireError::BadMagic { found });
        }
        if prefix.len() < HANDSHAKE_HEADER_LEN {
            return Ok(None);
        }
        let body_len = u16::from_le_bytes([prefix[6], prefix[7]]) as usize;
        Ok(Some(HANDSHAKE_HEADER_LEN + body_len))
    }

    /// Decodes a handshake from the start of `buf`; returns it and the bytes it used (anything
    /// after that is the first frame). Another version is rejected with
    /// [`WireError::VersionMismatch`] before its body is interpreted.
    pub fn decode(buf: &[u8]) -> Result<(Handshake, usize), WireError> {
        let mut c = Cursor::new(buf);
        let magic: [u8; 4] = c.array()?;
        if magic != MAGIC {
            return Err(WireError::BadMagic { found: magic });
        }
        let version = c.u16()?;
        if version != WIRE_VERSION {
            return Err(WireError::VersionMismatch {
                ours: WIRE_VERSION,
                theirs: version,
            });
        }
        let body_len = c.u16()? as usize;
        if body_len != HANDSHAKE_V1_BODY_LEN {
            return Err(WireError::HandshakeLength {
                version,
                expected: HANDSHAKE_V1_BODY_LEN,
                got: body_len,
            });
        }
        let mut body = Cursor::new(c.take(body_len)?);
        let node_id = body.array()?;
        let cluster = body.array()?;
        let tag = body.u8()?;
        let instance_id = body.u64()?;
        let stage_index = body.u16()?;
        let layer_start = body.u32()?;
        let layer_end = body.u32()?;
        body.finish()?;
        let role = match tag {
            ROLE_STAGE if layer_start > layer_end => {
                return Err(WireError::LayerRange {
                    start: layer_start,
                    end: layer_end,
                });
            }
            ROLE_STAGE => Role::Stage {
                instance_id,
                stage_index,
                layer_start,
                layer_end,
            },
            // Stage fields are written as zeros for owners, and must read as zeros (found by the
            // handshake fuzz target: a decoded handshake encodes back to its bytes).
            ROLE_OWNER if (stage_index, layer_start, layer_end) != (0, 0, 0) => {
                return Err(WireError::OwnerStageFields {
                    stage: stage_index,
                    start: layer_start,
                    end: layer_end,
                });
            }
            ROLE_OWNER => Role::Owner { instance_id },
            ROLE_MEMBER if layer_start == layer_end => {
                return Err(WireError::SelfLink { rank: layer_start });
            }
            ROLE_MEMBER => Role::Member {
                instance_id,
                stage_index,
                rank: layer_start,
                to: layer_end,
            },
            other => return Err(WireError::UnknownRole(other)),
        };
        let hs = Handshake {
            magic,
            version,
            node_id,
            cluster,
            role,
        };
        Ok((hs, HANDSHAKE_HEADER_LEN + body_len))
    }

    /// Checks the peer's handshake (`self`) against ours: same magic, same version, same cluster.
    pub fn check_compatible(&self, ours: &Handshake) -> Result<(), WireError> {
        if self.magic != MAGIC {
            return Err(WireError::BadMagic { found: self.magic });
        }
        if self.version != ours.version {
            return Err(WireError::VersionMismatch {
                ours: ours.version,
                theirs: self.version,
            });
        }
        if self.cluster != ours.cluster {
            return Err(WireError::ClusterMismatch);
        }
        Ok(())
    }
}
