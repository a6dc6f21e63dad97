//! Operational parameters (RFC 7143 §13): what one session runs with after
//! negotiation, and the limits this target offers.

/// Whether CRC32C digests are offered, accepted or required.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum DigestPolicy {
    /// Only `None` is accepted.
    Off,
    /// Whichever the initiator lists first (the RFC's responder rule).
    #[default]
    Allowed,
    /// Only `CRC32C` is accepted; a login offering only `None` fails.
    Required,
}

/// What this target offers and accepts in negotiation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Our MaxRecvDataSegmentLength (declared to the initiator).
    pub max_recv_data_segment: u32,
    /// Our MaxBurstLength offer.
    pub max_burst: u32,
    /// Our FirstBurstLength offer.
    pub first_burst: u32,
    /// Our MaxOutstandingR2T offer.
    pub max_outstanding_r2t: u16,
    /// We want InitialR2T=No (unsolicited data allowed).
    pub initial_r2t: bool,
    /// We want ImmediateData=Yes.
    pub immediate_data: bool,
    /// Header digest policy.
    pub header_digest: DigestPolicy,
    /// Data digest policy.
    pub data_digest: DigestPolicy,
    /// Command window per session: MaxCmdSN − ExpCmdSN + 1 when idle.
    pub queue_depth: u32,
    /// Largest single command transfer (EDTL) accepted.
    pub max_transfer: u32,
    /// DefaultTime2Wait offered.
    pub time2wait: u16,
    /// DefaultTime2Retain offered.
    pub time2retain: u16,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_recv_data_segment: 256 * 1024,
            max_burst: 1024 * 1024,
            first_burst: 256 * 1024,
            max_outstanding_r2t: 16,
            initial_r2t: false,
            immediate_data: true,
            header_digest: DigestPolicy::Allowed,
            data_digest: DigestPolicy::Allowed,
            queue_depth: 128,
            max_transfer: 32 * 1024 * 1024,
            time2wait: 2,
            time2retain: 20,
        }
    }
}

/// Largest command window (the seeds' "max outstanding target commands").
pub const MAX_QUEUE_DEPTH: u32 = 8192;

/// Normal or discovery session (the SessionType key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SessionType {
    #[default]
    Normal,
    Discovery,
}

/// The parameters a session runs with after login.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SessionParams {
    pub session_type: SessionType,
    pub initiator_name: String,
    pub initiator_alias: Option<String>,
    /// Empty for discovery sessions.
    pub target_name: String,
    pub header_digest: bool,
    pub data_digest: bool,
    /// What we may send in one PDU (the initiator's declaration).
    pub send_max_data_segment: u32,
    /// What we accept in one PDU (our declaration).
    pub recv_max_data_segment: u32,
    pub max_burst: u32,
    pub first_burst: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub max_outstanding_r2t: u16,
    pub data_pdu_in_order: bool,
    pub data_sequence_in_order: bool,
    pub error_recovery_level: u8,
    pub max_connections: u16,
    pub time2wait: u16,
    pub time2retain: u16,
}

impl SessionParams {
    /// RFC 7143 defaults, before any key is negotiated.
    pub fn rfc_defaults() -> Self {
        SessionParams {
            session_type: SessionType::Normal,
            initiator_name: String::new(),
            initiator_alias: None,
            target_name: String::new(),
            header_digest: false,
            data_digest: false,
            send_max_data_segment: 8192,
            recv_max_data_segment: 8192,
            max_burst: 262_144,
            first_burst: 65_536,
            initial_r2t: true,
            immediate_data: true,
            max_outstanding_r2t: 1,
            data_pdu_in_order: true,
            data_sequence_in_order: true,
            error_recovery_level: 0,
            max_connections: 1,
            time2wait: 2,
            time2retain: 20,
        }
    }
}
