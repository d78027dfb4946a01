//! The seed corpus, written by these tests so that it stays valid as the API and the input
//! types change: `cargo test` (in `fuzz/`) rewrites `corpus/<target>/seed-*`, and a seed whose
//! run no longer means what its name says fails here first. Every committed corpus file,
//! seeds and whatever else was added by hand (minimised crashes), is replayed too.
//!
//! One file per target, named after its harness: [`device`] (`device_queue`), [`driver`]
//! (`driver_queue`), [`ctrl`] (`ctrl_queue`), [`vhost_user`] (`vhost_user`), [`fdb`]
//! (`fdb`) and [`switch_forward`] (`switch_forward`). This file
//! writes and replays the corpus directories, and checks that every input variant encodes.

mod ctrl;
mod device;
mod driver;
mod fdb;
mod switch_forward;
mod vhost_user;

use std::path::{Path, PathBuf};

use crate::device::{DeviceInput, DeviceOp as D, UsedHead};
use crate::driver::{DriverInput, DriverOp as R};
use crate::encode::Encode;
use crate::mem::Placement;
use crate::rings::{Addr, Len, RawDesc, Scribble};

use self::device::{data, device};
use self::driver::{add, driver};

pub(crate) fn corpus_dir(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("corpus")
        .join(target)
}

/// Writes `seed-<name>` for each seed and removes `seed-*` files no seed writes any more.
pub(crate) fn write_corpus(target: &str, seeds: &[(&str, Vec<u8>)]) {
    let dir = corpus_dir(target);
    std::fs::create_dir_all(&dir).unwrap();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if let Some(stem) = name.strip_prefix("seed-") {
            if !seeds.iter().any(|(n, _)| *n == stem) {
                std::fs::remove_file(&path).unwrap();
            }
        }
    }
    for (name, bytes) in seeds {
        let path = dir.join(format!("seed-{name}"));
        // Leave identical files alone, so a clean tree stays clean.
        if std::fs::read(&path).ok().as_deref() != Some(bytes.as_slice()) {
            std::fs::write(&path, bytes).unwrap();
        }
    }
}

/// Runs every file in `corpus/<target>`: the seeds just written, and any other input committed
/// there (minimised crashes).
pub(crate) fn replay(target: &str, run: fn(&[u8])) {
    let dir = corpus_dir(target);
    let mut n = 0;
    for entry in std::fs::read_dir(&dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_file() {
            run(&std::fs::read(&path).unwrap());
            n += 1;
        }
    }
    assert!(n > 0, "{} is empty", dir.display());
}

/// Every enum variant survives encode/decode (the seeds above do not use them all).
#[test]
fn every_variant_round_trips() {
    let d = data(1, 2, 3, 4);
    let s = Scribble {
        offset: 7,
        bytes: vec![1, 2],
    };
    let dev_ops = vec![
        D::Pop,
        D::PopInto,
        D::AddUsed {
            head: UsedHead::Popped(3),
            len: 9,
        },
        D::AddUsed {
            head: UsedHead::Raw(65535),
            len: u32::MAX,
        },
        D::AddUsedRead(UsedHead::Popped(4)),
        D::AddUsedRead(UsedHead::Raw(65535)),
        D::Flush,
        D::NeedsNotification,
        D::EnableNotification,
        D::DisableNotification,
        D::AvailPending,
        D::SetUsedBatch(3),
        D::UndoPop(2),
        D::Scribble(s.clone()),
        D::WriteDesc { index: 5, desc: d },
        D::WriteIndirect { slot: 6, desc: d },
        D::Publish(vec![1, 2]),
        D::SetAvailIdx(1),
        D::SetAvailFlags(2),
        D::SetUsedEvent(3),
    ];
    let mut i = device(256);
    i.setup.placement = Placement::Custom {
        desc: 1,
        avail: 2,
        used: 3,
    };
    i.descs = [
        Addr::Data(1),
        Addr::Region1(2),
        Addr::Indirect(3),
        Addr::Raw(4),
    ]
    .into_iter()
    .zip([
        Len::Small(1),
        Len::Medium(2),
        Len::Raw(3),
        Len::Raw(u32::MAX),
    ])
    .map(|(addr, len)| RawDesc {
        addr,
        len,
        flags: 0xffff,
        next: 1,
    })
    .collect();
    i.ops = dev_ops;
    assert_eq!(crate::decode::<DeviceInput>(&i.to_bytes()), Some(i.clone()));

    let mut i = driver(2);
    i.setup.indirect_area = Some(255);
    i.ops = vec![
        add(1, 2),
        R::KickPrepare,
        R::GetUsed,
        R::UsedPending,
        R::EnableCb,
        R::EnableCbDelayed,
        R::EnableCbAfter(6),
        R::DisableCb,
        R::DetachUnused,
        R::SetPublishOnKick(true),
        R::Complete { pick: 1, len: 2 },
        R::SetAvailEvent(3),
        R::SetUsedFlags(4),
        R::WriteUsedElem {
            slot: 1,
            id: 2,
            len: 3,
        },
        R::SetUsedIdx(5),
        R::Scribble(s),
    ];
    assert_eq!(crate::decode::<DriverInput>(&i.to_bytes()), Some(i.clone()));
}
