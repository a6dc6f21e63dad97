//! Micro-benchmarks of the per-I/O codec work: decoding a SCSI Command,
//! framing a 4 KiB Data-Out, encoding Data-In into the send queue, and
//! CRC32C digests.

use std::hint::black_box;

use bytes::{Bytes, BytesMut};
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use iscsi_wire::frame::{frame_len, split_pdu, FrameLimits};
use iscsi_wire::outbox::Digests;
use iscsi_wire::pdu::*;
use iscsi_wire::{Outbox, Sn};

fn read10() -> Bhs {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x28;
    cdb[8] = 8;
    ScsiCommand {
        immediate: false,
        final_: true,
        read: true,
        write: false,
        attr: TaskAttr::Simple,
        lun: Lun::default(),
        itt: Itt(7),
        edtl: 4096,
        cmd_sn: Sn(1),
        exp_stat_sn: Sn(1),
        cdb,
    }
    .encode(0)
}

fn codec(c: &mut Criterion) {
    let bhs = read10();
    c.bench_function("decode SCSI Command BHS", |b| {
        b.iter(|| black_box(Pdu::parse(black_box(&bhs))))
    });

    let d = DataOut {
        final_: true,
        lun: Lun::default(),
        itt: Itt(1),
        ttt: 5,
        exp_stat_sn: Sn(1),
        data_sn: 0,
        buffer_offset: 0,
    };
    let mut wire = d.encode(4096).to_vec();
    wire.extend_from_slice(&[0xa5; 4096]);
    for digests in [false, true] {
        let lim = FrameLimits {
            header_digest: digests,
            data_digest: digests,
            max_data_segment: 1 << 20,
        };
        let mut out = Outbox::new();
        out.push_bytes(
            &d.encode(4096),
            Bytes::from(vec![0xa5u8; 4096]),
            Digests {
                header: digests,
                data: digests,
            },
        );
        let bytes = out.to_vec();
        let mut g = c.benchmark_group(if digests {
            "frame 4K Data-Out, digests"
        } else {
            "frame 4K Data-Out"
        });
        g.throughput(Throughput::Bytes(bytes.len() as u64));
        g.bench_function("frame_len + split_pdu", |b| {
            b.iter(|| {
                let mut buf = BytesMut::from(&bytes[..]);
                let n = frame_len(&buf, &lim).unwrap().unwrap();
                black_box(split_pdu(&mut buf, n, &lim).unwrap())
            })
        });
        g.finish();
    }
    let _ = wire;

    let data = Bytes::from(vec![0u8; 4096]);
    for digests in [false, true] {
        let dg = Digests {
            header: digests,
            data: digests,
        };
        let din = DataIn {
            final_: true,
            ack: false,
            status: Some(0),
            lun: Lun::default(),
            itt: Itt(3),
            ttt: RESERVED_TAG,
            sn: SnTriple::default(),
            data_sn: 0,
            buffer_offset: 0,
            residual: Residual::default(),
        };
        let mut out = Outbox::new();
        c.bench_function(
            if digests {
                "encode 4K Data-In, digests"
            } else {
                "encode 4K Data-In"
            },
            |b| {
                b.iter(|| {
                    out.push_bytes(&din.encode(4096), data.clone(), dg);
                    let n = out.len();
                    out.advance(n);
                })
            },
        );
    }

    let mut g = c.benchmark_group("crc32c");
    for size in [48usize, 4096, 65536] {
        let buf = vec![0x5au8; size];
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(format!("{size} bytes"), |b| {
            b.iter(|| black_box(iscsi_wire::digest::crc32c_parts(&[black_box(&buf)])))
        });
    }
    // A RAM LUN's 1 MiB chunk read whole: every byte, against folding its
    // 256 recorded block CRCs (filemap::BlockSums).
    let chunk = bytes::Bytes::from(vec![0x5au8; 1 << 20]);
    let sums = filemap::BlockSums::new(chunk.as_ptr(), chunk.len());
    iscsi_wire::digest::crc32c_summed(&chunk, &sums);
    g.throughput(Throughput::Bytes(chunk.len() as u64));
    g.bench_function("1 MiB, every byte", |b| {
        b.iter(|| black_box(iscsi_wire::digest::crc32c(black_box(&chunk))))
    });
    g.bench_function("1 MiB, folded from block CRCs", |b| {
        b.iter(|| black_box(iscsi_wire::digest::crc32c_summed(black_box(&chunk), &sums)))
    });
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
