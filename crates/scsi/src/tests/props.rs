//! Property tests: `plan` and `execute` never panic, whatever the input,
//! and a GOOD outcome never returns more data than `plan` announced.

use proptest::prelude::*;

use super::*;

/// Opcodes worth hitting often: everything implemented plus a few others.
const OPCODES: [u8; 33] = [
    0x00, 0x03, 0x08, 0x0A, 0x12, 0x15, 0x1A, 0x1B, 0x1E, 0x25, 0x28, 0x2A, 0x2E, 0x2F, 0x34, 0x35,
    0x55, 0x5A, 0x88, 0x8A, 0x8E, 0x8F, 0x90, 0x91, 0x9E, 0xA8, 0xAA, 0xAE, 0xAF, 0xA0, 0x89, 0x7F,
    0xFF,
];

fn cdb_strategy() -> impl Strategy<Value = Vec<u8>> {
    (
        prop_oneof![prop::sample::select(OPCODES.to_vec()), any::<u8>()],
        prop::collection::vec(any::<u8>(), 0..24),
        // Small lengths and LBAs often enough to reach the data paths.
        any::<bool>(),
    )
        .prop_map(|(opcode, mut rest, tame)| {
            if tame && rest.len() >= 15 {
                // Keep LBA/length fields small for 10/12/16-byte CDBs.
                for b in &mut rest[1..5] {
                    *b = 0;
                }
                rest[5] &= 0x0F;
                for b in &mut rest[8..12] {
                    *b = 0;
                }
                rest[12] &= 0x07;
            }
            let mut c = vec![opcode];
            c.extend(rest);
            c
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(3000))]

    #[test]
    fn never_panics(
        cdb in cdb_strategy(),
        data in prop::collection::vec(any::<u8>(), 0..4096),
        nexus in 0u64..4,
        reset in any::<bool>(),
    ) {
        let (lu, _b) = test_lu(cfg());
        if reset {
            lu.reset();
        }
        let plan = lu.plan(&cdb);
        let o = lu.execute(&cmd(&cdb, &wd(&data), NexusId(nexus)));
        prop_assert!(matches!(o.status, status::GOOD | status::CHECK_CONDITION));
        prop_assert_eq!(o.sense.is_some(), o.status == status::CHECK_CONDITION);
        if o.status == status::GOOD {
            prop_assert!(o.data_len() <= plan.data_in as usize,
                "{} bytes returned, {} planned", o.data_len(), plan.data_in);
        } else {
            prop_assert!(o.data.is_empty());
            let s = o.sense.unwrap();
            prop_assert_eq!(s.to_bytes().len(), 18);
            prop_assert!(s.to_descriptor_bytes().len() >= 8);
        }
    }

    #[test]
    fn plan_never_panics(cdb in prop::collection::vec(any::<u8>(), 0..40)) {
        let lu = mem_lu();
        let _ = lu.plan(&cdb);
    }
}
