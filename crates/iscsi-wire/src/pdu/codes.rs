//! The one-byte protocol numbers of RFC 7143 §11 as types: task attributes
//! (§11.3.1), the iSCSI response of a SCSI Response (§11.4.3), task
//! management responses (§11.6.1), asynchronous events (§11.9.1), logout
//! reasons and responses (§11.14.1, §11.15.1) and reject reasons
//! (§11.17.1), and the two-byte login status (§11.13.5, [`LoginStatus`]).
//!
//! Each decodes from any byte: a value the RFC does not name is kept as
//! `Other(byte)` and encodes back to the same byte, so a header from the
//! network never fails to decode for it (the protocol layer decides what an
//! unknown value means). Values are made with `From<u8>`, which never makes
//! `Other` of a named value.

/// Declares a one-byte code (module docs).
macro_rules! code {
    (
        $(#[$meta:meta])*
        $name:ident {
            $( $(#[$vmeta:meta])* $var:ident = $val:literal, $text:literal; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name {
            $( $(#[$vmeta])* $var, )*
            /// A value the RFC does not name, kept as received.
            Other(u8),
        }

        impl From<u8> for $name {
            fn from(b: u8) -> Self {
                match b {
                    $( $val => $name::$var, )*
                    other => $name::Other(other),
                }
            }
        }

        impl From<$name> for u8 {
            fn from(c: $name) -> u8 {
                match c {
                    $( $name::$var => $val, )*
                    $name::Other(b) => b,
                }
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                match self {
                    $( $name::$var => f.write_str($text), )*
                    $name::Other(b) => write!(f, "0x{b:02x}"),
                }
            }
        }
    };
}

code! {
    /// Task attribute of a SCSI Command (§11.3.1, SAM-5 §8.8).
    TaskAttr {
        /// No tag (ATTR 0).
        Untagged = 0, "untagged";
        /// SIMPLE.
        Simple = 1, "simple";
        /// ORDERED.
        Ordered = 2, "ordered";
        /// HEAD OF QUEUE.
        HeadOfQueue = 3, "head of queue";
        /// ACA.
        Aca = 4, "ACA";
    }
}

code! {
    /// The iSCSI response of a SCSI Response (§11.4.3).
    IscsiResponse {
        /// Command Completed at Target (its SCSI status says how).
        Completed = 0, "command completed at target";
        /// Target Failure.
        TargetFailure = 1, "target failure";
    }
}

code! {
    /// Task Management Function Response (§11.6.1).
    TmfResponse {
        /// Function complete.
        Complete = 0, "function complete";
        /// Task does not exist.
        NoSuchTask = 1, "task does not exist";
        /// LUN does not exist.
        NoSuchLun = 2, "LUN does not exist";
        /// Task still allegiant.
        TaskAllegiant = 3, "task still allegiant";
        /// Task allegiance reassignment not supported.
        ReassignUnsupported = 4, "task allegiance reassignment not supported";
        /// Task management function not supported.
        FunctionUnsupported = 5, "function not supported";
        /// Function authorization failed.
        AuthorizationFailed = 6, "function authorization failed";
        /// Function rejected.
        Rejected = 255, "function rejected";
    }
}

code! {
    /// Asynchronous Message event (§11.9.1).
    AsyncEvent {
        /// A SCSI asynchronous event (sense data in the data segment).
        ScsiEvent = 0, "SCSI asynchronous event";
        /// The target asks for a logout.
        LogoutRequest = 1, "logout requested";
        /// The target will drop the connection.
        DroppingConnection = 2, "dropping the connection";
        /// The target will drop all the session's connections.
        DroppingAllConnections = 3, "dropping all connections";
        /// The target asks to renegotiate operational parameters.
        Renegotiate = 4, "renegotiation requested";
        /// Vendor specific.
        VendorSpecific = 255, "vendor specific";
    }
}

code! {
    /// Logout Request reason (§11.14.1).
    LogoutReason {
        /// Close the session.
        CloseSession = 0, "close the session";
        /// Close the connection.
        CloseConnection = 1, "close the connection";
        /// Remove the connection for recovery.
        RemoveForRecovery = 2, "remove the connection for recovery";
    }
}

code! {
    /// Logout Response (§11.15.1).
    LogoutResponse {
        /// Connection or session closed successfully.
        Closed = 0, "closed successfully";
        /// CID not found.
        CidNotFound = 1, "CID not found";
        /// Connection recovery is not supported.
        RecoveryUnsupported = 2, "connection recovery not supported";
        /// Cleanup failed for various reasons.
        CleanupFailed = 3, "cleanup failed";
    }
}

code! {
    /// Reject reason (§11.17.1).
    RejectReason {
        /// Data (payload) digest error.
        DataDigestError = 0x02, "data digest error";
        /// SNACK Reject.
        SnackReject = 0x03, "SNACK reject";
        /// Protocol error.
        ProtocolError = 0x04, "protocol error";
        /// Command not supported.
        CommandNotSupported = 0x05, "command not supported";
        /// Immediate command reject: too many immediate commands.
        ImmediateCommandReject = 0x06, "immediate command reject";
        /// Task in progress.
        TaskInProgress = 0x07, "task in progress";
        /// Invalid data ACK.
        InvalidDataAck = 0x08, "invalid data ACK";
        /// Invalid PDU field.
        InvalidPduField = 0x09, "invalid PDU field";
        /// Long operation reject: out of resources.
        OutOfResources = 0x0a, "out of resources";
        /// Negotiation reset (deprecated).
        NegotiationReset = 0x0b, "negotiation reset";
        /// Waiting for logout.
        WaitingForLogout = 0x0c, "waiting for logout";
    }
}

/// A Login Response's status: its class and detail (§11.13.5). Class 0 is
/// success, 1 redirection, 2 an initiator error, 3 a target error; every
/// pair decodes, named or not.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LoginStatus {
    /// Status-Class.
    pub class: u8,
    /// Status-Detail.
    pub detail: u8,
}

impl LoginStatus {
    pub const SUCCESS: Self = Self::new(0, 0);
    pub const INITIATOR_ERROR: Self = Self::new(2, 0);
    pub const AUTH_FAILED: Self = Self::new(2, 1);
    pub const FORBIDDEN: Self = Self::new(2, 2);
    pub const NOT_FOUND: Self = Self::new(2, 3);
    pub const TARGET_REMOVED: Self = Self::new(2, 4);
    pub const UNSUPPORTED_VERSION: Self = Self::new(2, 5);
    pub const TOO_MANY_CONNECTIONS: Self = Self::new(2, 6);
    pub const MISSING_PARAMETER: Self = Self::new(2, 7);
    pub const CANT_INCLUDE_IN_SESSION: Self = Self::new(2, 8);
    pub const SESSION_TYPE_UNSUPPORTED: Self = Self::new(2, 9);
    pub const SESSION_DOES_NOT_EXIST: Self = Self::new(2, 10);
    pub const INVALID_DURING_LOGIN: Self = Self::new(2, 11);
    pub const TARGET_ERROR: Self = Self::new(3, 0);
    pub const SERVICE_UNAVAILABLE: Self = Self::new(3, 1);
    pub const OUT_OF_RESOURCES: Self = Self::new(3, 2);

    /// The status with this class and detail.
    pub const fn new(class: u8, detail: u8) -> Self {
        LoginStatus { class, detail }
    }

    /// Class 0: the login step succeeded.
    pub const fn is_success(self) -> bool {
        self.class == 0
    }

    /// What the status means (§11.13.5's table), by class where the detail
    /// is not one the RFC names.
    pub const fn describe(self) -> &'static str {
        match (self.class, self.detail) {
            (0, _) => "success",
            (1, 1) => "target moved temporarily",
            (1, 2) => "target moved permanently",
            (1, _) => "target moved",
            (2, 1) => "authentication failed",
            (2, 2) => "authorization failure",
            (2, 3) => "target not found",
            (2, 4) => "target removed",
            (2, 5) => "unsupported version",
            (2, 6) => "too many connections",
            (2, 7) => "missing parameter",
            (2, 8) => "can't include in session",
            (2, 9) => "session type not supported",
            (2, 10) => "session does not exist",
            (2, 11) => "invalid request during login",
            (2, _) => "initiator error",
            (3, 1) => "service unavailable",
            (3, 2) => "out of resources",
            (3, _) => "target error",
            _ => "unknown status",
        }
    }
}

impl std::fmt::Display for LoginStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{:02x}{:02x} ({})",
            self.class,
            self.detail,
            self.describe()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_byte_round_trips() {
        for b in 0..=255u8 {
            assert_eq!(u8::from(TaskAttr::from(b)), b);
            assert_eq!(u8::from(IscsiResponse::from(b)), b);
            assert_eq!(u8::from(TmfResponse::from(b)), b);
            assert_eq!(u8::from(AsyncEvent::from(b)), b);
            assert_eq!(u8::from(LogoutReason::from(b)), b);
            assert_eq!(u8::from(LogoutResponse::from(b)), b);
            assert_eq!(u8::from(RejectReason::from(b)), b);
        }
    }

    #[test]
    fn login_status_names_and_shows_class_and_detail() {
        assert_eq!(LoginStatus::new(2, 1), LoginStatus::AUTH_FAILED);
        assert!(LoginStatus::SUCCESS.is_success() && !LoginStatus::OUT_OF_RESOURCES.is_success());
        assert_eq!(
            LoginStatus::AUTH_FAILED.to_string(),
            "0201 (authentication failed)"
        );
        assert_eq!(LoginStatus::new(2, 0x7f).describe(), "initiator error");
        assert_eq!(LoginStatus::new(9, 9).describe(), "unknown status");
    }

    #[test]
    fn named_values_decode_to_their_names() {
        assert_eq!(TmfResponse::from(255), TmfResponse::Rejected);
        assert_eq!(RejectReason::from(9), RejectReason::InvalidPduField);
        assert_eq!(RejectReason::from(1), RejectReason::Other(1));
        assert_eq!(TaskAttr::from(1).to_string(), "simple");
        assert_eq!(LogoutReason::from(7).to_string(), "0x07");
    }
}
