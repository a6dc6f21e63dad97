//! The completion-driven READ/WRITE split ([`crate::fast`]): admitted only
//! when `execute` would go straight to the backend, and finishing with the
//! same outcome.

use bytes::Bytes;

use super::*;
use crate::FastKind;

fn admit(lu: &LogicalUnit, cdb: &[u8], data: &Bytes) -> Option<crate::FastIo> {
    lu.admit_fast(&cmd(cdb, data, N1), data)
}

/// A unit whose nexus N1 has seen its power-on unit attention.
fn quiet(lu: &LogicalUnit) {
    let _ = run(lu, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], &[]);
    good(&run(lu, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], &[]));
}

#[test]
fn plain_reads_and_writes_are_admitted() {
    let lu = mem_lu();
    quiet(&lu);
    let none = Bytes::new();
    let io = admit(&lu, &read10(8, 2), &none).expect("a READ(10)");
    assert_eq!(
        (io.offset, io.len, io.kind.clone()),
        (8 * 512, 1024, FastKind::Read)
    );
    let data = Bytes::from(pattern(1024, 7));
    let io = admit(&lu, &cdb16(op::WRITE_16, 0x08, 4, 2), &data).expect("a WRITE(16) FUA");
    assert_eq!(
        io.kind,
        FastKind::Write {
            data: data.clone(),
            fua: true
        }
    );
    good(&lu.finish_fast(io, Ok(Bytes::new())));
    let io = admit(&lu, &read10(8, 2), &none).unwrap();
    let o = lu.finish_fast(io, Ok(data.clone()));
    good(&o);
    assert_eq!(o.data, data);
}

#[test]
fn anything_else_takes_the_ordinary_path() {
    let lu = mem_lu();
    let none = Bytes::new();
    // The power-on unit attention is still pending for N1.
    assert!(admit(&lu, &read10(0, 1), &none).is_none());
    quiet(&lu);
    assert!(admit(&lu, &read10(0, 1), &none).is_some());
    // Other opcodes, the 6/12-byte forms, zero length, out of range,
    // protection bits, NACA, a short data-out.
    assert!(admit(&lu, &[op::TEST_UNIT_READY, 0, 0, 0, 0, 0], &none).is_none());
    assert!(admit(&lu, &cdb12(op::READ_12, 0, 0, 1), &none).is_none());
    assert!(admit(&lu, &read10(0, 0), &none).is_none());
    assert!(admit(&lu, &read10(BLOCKS as u32, 1), &none).is_none());
    assert!(admit(&lu, &cdb10(op::READ_10, 0x20, 0, 1), &none).is_none());
    let mut naca = read10(0, 1);
    naca[9] = 0x04;
    assert!(admit(&lu, &naca, &none).is_none());
    let short = Bytes::from(vec![0u8; 512]);
    assert!(admit(&lu, &write10(0, 2), &short).is_none());
    // An exclusive holder (COMPARE AND WRITE) on the range: no waiting.
    let x = lu.locks.exclusive(0, 1);
    assert!(admit(&lu, &read10(0, 1), &none).is_none());
    assert!(
        admit(&lu, &read10(4096 - 1, 1), &none).is_some(),
        "another region"
    );
    drop(x);
    assert!(admit(&lu, &read10(0, 1), &none).is_some());
    // Write protect.
    let mut c = cfg();
    c.read_only = true;
    let ro = LogicalUnit::new(Arc::new(MemBackend::new(BLOCKS * 512)), c).unwrap();
    quiet(&ro);
    assert!(admit(&ro, &write10(0, 1), &short).is_none());
    assert!(admit(&ro, &read10(0, 1), &none).is_some());
}

#[test]
fn backend_errors_finish_as_execute_reports_them() {
    let lu = mem_lu();
    quiet(&lu);
    let none = Bytes::new();
    let eio = || io::Error::other("boom");
    let io = admit(&lu, &read10(0, 1), &none).unwrap();
    sense(
        &lu.finish_fast(io, Err(eio())),
        SenseKey::MediumError,
        Asc::UNRECOVERED_READ_ERROR,
    );
    let d = Bytes::from(vec![1u8; 512]);
    let io = admit(&lu, &write10(0, 1), &d).unwrap();
    sense(
        &lu.finish_fast(io, Err(eio())),
        SenseKey::MediumError,
        Asc::WRITE_ERROR,
    );
    // The range lock went with the command.
    drop(lu.locks.exclusive(0, BLOCKS));
}
