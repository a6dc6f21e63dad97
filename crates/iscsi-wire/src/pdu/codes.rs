//! The one-byte protocol numbers of RFC 7143 §11 as types: task attributes
//! (§11.3.1), the iSCSI response of a SCSI Response (§11.4.3), task
//! management responses (§11.6.1), asynchronous events (§11.9.1), logout
//! reasons and responses (§11.14.1, §11.15.1) and reject reasons
//! (§11.17.1). Login status classes and details (§11.13.5) are named in
//! `iscsi_proto::login::status`.
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
    fn named_values_decode_to_their_names() {
        assert_eq!(TmfResponse::from(255), TmfResponse::Rejected);
        assert_eq!(RejectReason::from(9), RejectReason::InvalidPduField);
        assert_eq!(RejectReason::from(1), RejectReason::Other(1));
        assert_eq!(TaskAttr::from(1).to_string(), "simple");
        assert_eq!(LogoutReason::from(7).to_string(), "0x07");
    }
}
