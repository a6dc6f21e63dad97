//! A real PDU as captured on the wire: the Login Request libiscsi 1.19
//! (`iscsi-inq`, Debian libiscsi-bin) sends, decoded and answered by the
//! target's login state machine.

use bytes::BytesMut;
use iscsi_proto::login::{LoginStep, TargetDirectory, TargetInfo, TargetLogin};
use iscsi_proto::params::Limits;
use iscsi_wire::frame::{frame_len, split_pdu, FrameLimits};
use iscsi_wire::pdu::{Itt, Pdu};
use iscsi_wire::text;

const BHS: &str = "43870000000001a0803a15350000000040fee0190000000011477e4c0000000100000000000000000000000000000000";
const DATA: &[&str] = &[
        "496e69746961746f724e616d653d69716e2e323032362d31312e746573743a63617074757265005461726765744e616d",
        "653d69716e2e323032362d31312e696f2e69726f6e73616e3a746172676574300053657373696f6e547970653d4e6f72",
        "6d616c004865616465724469676573743d4e6f6e652c43524333324300446174614469676573743d4e6f6e6500496e69",
        "7469616c5232543d4e6f00496d6d656469617465446174613d596573004d617842757273744c656e6774683d32363231",
        "343400466972737442757273744c656e6774683d3236323134340044656661756c7454696d6532576169743d32004465",
        "6661756c7454696d653252657461696e3d30004d61784f75747374616e64696e675232543d31004572726f725265636f",
        "766572794c6576656c3d300049464d61726b65723d4e6f004f464d61726b65723d4e6f004d6178436f6e6e656374696f",
        "6e733d31004d617852656376446174615365676d656e744c656e6774683d3236323134340044617461504455496e4f72",
        "6465723d596573004461746153657175656e6365496e4f726465723d59657300",
];

fn hex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

struct Dir;
impl TargetDirectory for Dir {
    fn find(&self, name: &str, _i: &str) -> Option<TargetInfo> {
        Some(TargetInfo {
            name: name.into(),
            alias: None,
            tpgt: 1,
        })
    }
}

#[test]
fn libiscsi_login_request_is_framed_decoded_and_answered() {
    let mut wire = hex(BHS);
    let data: Vec<u8> = DATA.iter().flat_map(|c| hex(c)).collect();
    wire.extend_from_slice(&data);
    let mut buf = BytesMut::from(&wire[..]);
    let n = frame_len(&buf, &FrameLimits::LOGIN)
        .unwrap()
        .expect("one whole PDU");
    assert_eq!(n, wire.len());
    let raw = split_pdu(&mut buf, n, &FrameLimits::LOGIN).unwrap();
    let Pdu::LoginReq(req) = Pdu::parse(&raw.bhs) else {
        panic!("not a login request")
    };
    assert!(req.transit && !req.cont);
    assert_eq!(
        (req.csg, req.nsg),
        (1, 3),
        "libiscsi skips the security stage without CHAP"
    );
    assert_eq!(req.tsih, 0);
    assert_eq!(req.isid[0] & 0xc0, 0x80, "random ISID");
    assert_eq!(
        req.encode(data.len()).to_vec(),
        hex(BHS),
        "re-encodes to the same bytes"
    );
    let keys = text::parse(&raw.data).unwrap();
    assert_eq!(
        keys[0],
        (
            "InitiatorName".to_string(),
            "iqn.2026-11.test:capture".to_string()
        )
    );
    assert_eq!(keys.len(), 19);

    let mut login = TargetLogin::new(Limits::default(), 1);
    let LoginStep::Complete {
        resp, text: answer, ..
    } = login.handle(&req, &raw.data, &Dir)
    else {
        panic!("login not completed")
    };
    assert_eq!(resp.itt, req.itt);
    assert_eq!(
        resp.sn.exp_cmd_sn, req.cmd_sn,
        "login does not consume a CmdSN"
    );
    assert_eq!(
        resp.itt,
        Itt(u32::from_be_bytes(hex(BHS)[16..20].try_into().unwrap()))
    );
    let answered = text::parse(&answer).unwrap();
    for k in [
        "HeaderDigest",
        "DataDigest",
        "InitialR2T",
        "ImmediateData",
        "MaxBurstLength",
        "FirstBurstLength",
        "MaxOutstandingR2T",
        "ErrorRecoveryLevel",
        "MaxRecvDataSegmentLength",
        "TargetPortalGroupTag",
    ] {
        assert!(answered.iter().any(|(a, _)| a == k), "{k} not answered");
    }
}
