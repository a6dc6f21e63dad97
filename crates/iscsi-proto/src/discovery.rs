//! SendTargets (RFC 7143 §13 Appendix C): the text a discovery session
//! answers with — each target's name followed by the address of every
//! portal it can be reached through, with that portal's group tag.

use std::net::SocketAddr;

use iscsi_wire::text;

/// One target as SendTargets lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Listing {
    pub name: String,
    /// Each portal and its target portal group tag.
    pub portals: Vec<(SocketAddr, u16)>,
}

/// The SendTargets response text for `targets` given the request `value`:
/// `All` lists every target; a target name lists that one; an empty value
/// lists the session's own target (`session_target`).
pub fn send_targets(targets: &[Listing], value: &str, session_target: Option<&str>) -> Vec<u8> {
    let mut out = Vec::new();
    for t in targets {
        let wanted = match value {
            "All" => true,
            "" => session_target == Some(t.name.as_str()),
            name => name == t.name,
        };
        if !wanted {
            continue;
        }
        text::push(&mut out, "TargetName", &t.name);
        for (addr, tpgt) in &t.portals {
            let a = match addr {
                SocketAddr::V4(a) => format!("{}:{},{}", a.ip(), a.port(), tpgt),
                SocketAddr::V6(a) => format!("[{}]:{},{}", a.ip(), a.port(), tpgt),
            };
            text::push(&mut out, "TargetAddress", &a);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_portals() {
        let t = vec![
            Listing {
                name: "iqn.a".into(),
                portals: vec![
                    ("127.0.0.1:3260".parse().unwrap(), 1),
                    ("[::1]:3261".parse().unwrap(), 2),
                ],
            },
            Listing {
                name: "iqn.b".into(),
                portals: vec![("127.0.0.1:3260".parse().unwrap(), 1)],
            },
        ];
        let all = text::parse(&send_targets(&t, "All", None)).unwrap();
        assert_eq!(all.len(), 5);
        assert_eq!(all[1].1, "127.0.0.1:3260,1");
        assert_eq!(all[2].1, "[::1]:3261,2");
        let one = text::parse(&send_targets(&t, "iqn.b", None)).unwrap();
        assert_eq!(one[0].1, "iqn.b");
        assert_eq!(one.len(), 2);
        assert!(send_targets(&t, "iqn.none", None).is_empty());
        assert_eq!(
            text::parse(&send_targets(&t, "", Some("iqn.a"))).unwrap()[0].1,
            "iqn.a"
        );
    }
}
