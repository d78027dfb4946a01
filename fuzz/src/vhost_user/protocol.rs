//! The vhost-user numbers the harness writes and checks (vhost-user spec, "Front-end message
//! types" and "Message header").

/// vhost-user request codes (spec, "Front-end message types").
pub mod code {
    pub const GET_FEATURES: u32 = 1;
    pub const SET_FEATURES: u32 = 2;
    pub const SET_OWNER: u32 = 3;
    pub const RESET_OWNER: u32 = 4;
    pub const SET_MEM_TABLE: u32 = 5;
    pub const SET_LOG_BASE: u32 = 6;
    pub const SET_LOG_FD: u32 = 7;
    pub const SET_VRING_NUM: u32 = 8;
    pub const SET_VRING_ADDR: u32 = 9;
    pub const SET_VRING_BASE: u32 = 10;
    pub const GET_VRING_BASE: u32 = 11;
    pub const SET_VRING_KICK: u32 = 12;
    pub const SET_VRING_CALL: u32 = 13;
    pub const SET_VRING_ERR: u32 = 14;
    pub const GET_PROTOCOL_FEATURES: u32 = 15;
    pub const SET_PROTOCOL_FEATURES: u32 = 16;
    pub const GET_QUEUE_NUM: u32 = 17;
    pub const SET_VRING_ENABLE: u32 = 18;
    pub const SET_BACKEND_REQ_FD: u32 = 21;
    pub const GET_CONFIG: u32 = 24;
    pub const SET_INFLIGHT_FD: u32 = 32;
    pub const ADD_MEM_REG: u32 = 37;
    pub const SET_DEVICE_STATE_FD: u32 = 42;
    /// The highest code the spec defines (GET_SHMEM_CONFIG).
    pub const LAST: u32 = 44;
}

/// Header flags: version 1 in the low bits, then REPLY and NEED_REPLY.
pub const VERSION_1: u32 = 0x1;
pub const REPLY: u32 = 0x4;
pub const NEED_REPLY: u32 = 0x8;
pub const HEADER_LEN: usize = 12;
/// The message layer's body limit.
pub const MAX_BODY: usize = 0x1000;
/// VHOST_USER_F_PROTOCOL_FEATURES.
pub const PROTOCOL_FEATURES_BIT: u64 = 1 << 30;
/// VHOST_USER_VRING_NOFD_MASK: the kick/call/err message carries no fd.
pub const NOFD: u64 = 0x100;

/// vhost-user protocol features (spec, "Protocol features").
pub mod protocol_feature {
    pub const MQ: u64 = 1 << 0;
    pub const REPLY_ACK: u64 = 1 << 3;
    pub const MTU: u64 = 1 << 4;
    pub const CONFIG: u64 = 1 << 9;
}
