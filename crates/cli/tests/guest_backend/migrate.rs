//! Operating a guest on `virtnet backend` as QEMU and libvirt do (issue 15):
//!
//! - [`guest_memory_hotplug_reaches_the_backend`]: a memfd DIMM hotplugged through the
//!   monitor reaches the backend as ADD_MEM_REG (CONFIGURE_MEM_SLOTS), the guest onlines it,
//!   and traffic goes on.
//! - [`guest_live_migrates_to_another_backend_and_back`]: the guest pings the host under an
//!   iperf3 towards it while it migrates from QEMU A on backend 1 to QEMU B on backend 2,
//!   then on to QEMU C on backend 3 (a second migration from a backend that was a
//!   destination): QEMU accepts the backend for migration (dirty logging, LOG_SHMFD), both
//!   migrations complete, each destination backend announces the guest (SEND_RARP), and at
//!   most a few pings are lost. Each destination's memory must be the source's byte for byte.
//!
//! Each destination starts paused (`-S`, as libvirt starts one) so that its memory can be
//! compared, and is resumed with `cont`. The guest's memory is padded
//! ([`testkit::guest::MIGRATION_PAD`]) around a QEMU 7.2 TCG bug that loses the guest CPU's
//! writes during a migration (differing pages, and crashed guest kernels on the destination).

use std::time::{Duration, Instant};

use testkit::guest::{Guest, Monitor};
use testkit::report;

use super::host::Host;
use super::{prerequisites, serial};

/// `N packets transmitted, M packets received` of busybox ping, as (N, M).
fn ping_counts(output: &[String]) -> Option<(u32, u32)> {
    let line = output.iter().find(|l| l.contains("packets transmitted"))?;
    let mut words = line.split_whitespace();
    let sent = words.next()?.parse().ok()?;
    let received = line
        .split(", ")
        .nth(1)?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some((sent, received))
}

#[test]
fn guest_memory_hotplug_reaches_the_backend() {
    const TEST: &str = "guest_memory_hotplug";
    let _serial = serial();
    let Some(image) = prerequisites(TEST) else {
        return;
    };
    let mut host = Host::with_backend("hotplug", &[]);
    // The DIMM's memory onlined by the guest kernel as it arrives; then traffic in a guest
    // with 256 MiB more, some of which its rx buffers may now come from.
    let script = r#"
mem() { awk '/MemTotal/ { print $2 }' /proc/meminfo; }
ping -c 3 -i 0.2 -W 2 "$VN_PEER"
before=$(mem)
vn_result mem_before_kib "$before"
vn_mark hotplug
i=0
until [ "$(mem)" -gt "$before" ]; do sleep 0.2; i=$((i + 1)); [ $i -lt 300 ]; done
vn_result mem_after_kib "$(mem)"
ping -c 20 -i 0.1 -W 2 "$VN_PEER" > /tmp/ping.txt || true
cat /tmp/ping.txt
vn_result ping_loss "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/ping.txt)"
iperf3 -c "$VN_PEER" -p 5201 -t 2 -f m -R > /tmp/iperf.txt
cat /tmp/iperf.txt
"#;
    let mut config = host.guest_config(script);
    config.memory_mb = 256;
    config.hotplug = Some((2, 1024));
    config.extra_append = "memhp_default_state=online".to_string();
    let monitor_path = host.dir().join("monitor.sock");
    config.monitor = Some(monitor_path.clone());
    let mut guest = host.start_guest(image, config);
    let mut monitor = Monitor::connect(&monitor_path, Duration::from_secs(10)).unwrap();
    guest.wait_ready().unwrap_or_else(|e| panic!("{e}"));
    guest
        .wait_mark("hotplug", Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    let log_mark = host.backend().out.len();
    for cmd in [
        "object_add memory-backend-memfd,id=hp0,size=256M,share=on",
        "device_add pc-dimm,id=dimm0,memdev=hp0",
    ] {
        let out = monitor.command(cmd).unwrap();
        assert!(!out.contains("rror"), "{cmd}: {out}");
    }
    // The DIMM, 256 MiB at 4 GiB, as one more region of the backend's memory (the log's
    // fields may come with terminal colours around them).
    let added = |l: &str| {
        l.contains("memory region added") && l.contains("4294967296") && l.contains("268435456")
    };
    let found =
        host.backend()
            .out
            .wait_for(log_mark, Instant::now() + Duration::from_secs(20), added);
    assert!(found.is_ok(), "no ADD_MEM_REG:\n{}", host.backend_log());
    let run = guest
        .finish()
        .unwrap_or_else(|e| panic!("{e}\nbackend:\n{}", host.backend_log()));
    run.assert_script_ok();
    let kib = |k: &str| -> u64 { run.result(k).and_then(|v| v.parse().ok()).unwrap_or(0) };
    let grown = kib("mem_after_kib") - kib("mem_before_kib");
    report(&format!(
        "guest memory grew by {grown} KiB; {}",
        run.timing()
    ));
    assert!(
        grown >= 200 * 1024,
        "the guest did not online the DIMM: {grown} KiB"
    );
    assert_eq!(
        run.result("ping_loss"),
        Some("0"),
        "{:?}",
        run.script_output
    );
    assert!(
        run.script_output.iter().any(|l| l.contains("receiver")),
        "iperf3 did not finish: {:?}",
        run.script_output
    );
    let stats = host.stats();
    assert!(stats.broken().is_empty(), "broken: {:?}", stats.broken());
}

/// Migrates the guest behind `from` to the QEMU behind `to`, listening on `port`; panics with
/// their output unless the migration completes and `to` has loaded it within `limit`. Returns
/// how long it took.
fn migrate(from: &mut Monitor, to: &mut Monitor, port: u16, limit: Duration) -> Duration {
    let start = Instant::now();
    // Zero pages dominate a small guest; no need to cap the rate on one host.
    from.command("migrate_set_parameter max-bandwidth 1G")
        .unwrap();
    let out = from
        .command(&format!("migrate -d tcp:127.0.0.1:{port}"))
        .unwrap();
    assert!(!out.contains("rror"), "migrate: {out}");
    from.wait_migrated(limit).unwrap_or_else(|e| panic!("{e}"));
    // The source is done when it has sent the last pages; the destination may still be
    // reading them, and its memory is compared only once it has loaded them all.
    let sent = Instant::now();
    to.wait_incoming(limit).unwrap_or_else(|e| panic!("{e}"));
    report(&format!(
        "the destination had loaded it {:.1?} after the source completed",
        sent.elapsed()
    ));
    start.elapsed()
}

/// Dumps the guest's memory through both monitors and returns the pages (guest addresses)
/// that differ: with the source stopped by the migration and the destination not yet
/// running, none may.
fn differing_pages(
    dir: &std::path::Path,
    source: &mut Monitor,
    destination: &mut Monitor,
    len: u64,
) -> Vec<u64> {
    use std::io::Read;
    let dump = |m: &mut Monitor, name: &str| {
        let path = dir.join(name);
        let out = m
            // Quoted: unquoted, the path's slashes would be read as divisions of the size.
            .command(&format!("pmemsave 0 {len:#x} \"{}\"", path.display()))
            .unwrap();
        assert!(path.exists(), "pmemsave: {out}");
        path
    };
    let (a, b) = (
        dump(source, "source.mem"),
        dump(destination, "destination.mem"),
    );
    let (mut fa, mut fb) = (
        std::fs::File::open(&a).unwrap(),
        std::fs::File::open(&b).unwrap(),
    );
    let mut differ = Vec::new();
    let (mut pa, mut pb) = (vec![0u8; 4096], vec![0u8; 4096]);
    for page in 0..len / 4096 {
        fa.read_exact(&mut pa).unwrap();
        fb.read_exact(&mut pb).unwrap();
        if pa != pb {
            if differ.len() < 8 {
                report(&describe_difference(page * 4096, &pa, &pb));
            }
            differ.push(page * 4096);
        }
    }
    let _ = std::fs::remove_file(a);
    let _ = std::fs::remove_file(b);
    differ
}

/// Where two copies of the page at `addr` differ, and the first differing bytes of each: what
/// wrote them (a frame's headers, zeroes on one side) tells which writer the log missed.
fn describe_difference(addr: u64, source: &[u8], destination: &[u8]) -> String {
    let differ: Vec<usize> = (0..source.len())
        .filter(|&i| source[i] != destination[i])
        .collect();
    let (first, last) = (differ[0], differ[differ.len() - 1]);
    let show = |p: &[u8]| {
        p[first..(first + 32).min(p.len())]
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    };
    format!(
        "page {addr:#x}: {} bytes differ in {first:#x}..={last:#x}; source {}, destination {}",
        differ.len(),
        show(source),
        show(destination)
    )
}

/// Asserts that the paused destination's memory is the stopped source's, page for page. Under
/// QEMU 7.2's TCG this holds only with the guest's memory padded
/// ([`testkit::guest::MIGRATION_PAD`]): without it, CI found 55 to 144 differing pages, kernel
/// data among them, and once the guest's kernel crashed on the destination.
fn assert_same_memory(migration: u32, differ: &[u64]) {
    assert!(
        differ.is_empty(),
        "migration {migration}: {} pages differ from the source's (the first described above): \
         {:x?}",
        differ.len(),
        &differ[..differ.len().min(40)]
    );
    report(&format!(
        "migration {migration}: the destination's memory is the source's byte for byte"
    ));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

#[test]
fn guest_live_migrates_to_another_backend_and_back() {
    const TEST: &str = "guest_live_migration";
    let _serial = serial();
    let Some(image) = prerequisites(TEST) else {
        return;
    };
    let mut host = Host::with_backend("migrate", &[]);
    // 30 s of pings every 0.2 s, spanning both migrations, under an iperf3 from the host
    // that keeps the backend writing into the guest's buffers while it migrates. The guest
    // goes on with the script on each destination where the source left it; at the end its
    // kernel log must show no ring the device left inconsistent.
    let script = r#"
ping -c 3 -i 0.2 -W 2 "$VN_PEER"
timeout 40 iperf3 -c "$VN_PEER" -p 5201 -R -t 25 -f m > /tmp/iperf.txt 2>&1 &
vn_mark pinging
ping -c 150 -i 0.2 -W 1 "$VN_PEER" > /tmp/ping.txt || true
wait || true
cat /tmp/ping.txt /tmp/iperf.txt
vn_result ping_loss "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/ping.txt)"
dmesg | grep -i virtio || true
vn_mark done
"#;
    let config = |host: &Host, socket: &std::path::Path, name: &str, incoming: Option<u16>| {
        let mut c = host.guest_config(script);
        c.netdev = testkit::guest::Netdev::VhostUser {
            socket: socket.to_path_buf(),
            queues: 1,
            reconnect_secs: None,
            server: false,
        };
        c.memory_mb = 256;
        c.migratable = true;
        c.monitor = Some(host.dir().join(format!("{name}-monitor.sock")));
        c.incoming = incoming.map(|p| format!("tcp:127.0.0.1:{p}"));
        // A destination waits, paused, for its memory to be compared with the source's.
        c.paused = incoming.is_some();
        c.script_timeout = Duration::from_secs(180);
        c
    };
    let mem = config(&host, &host.socket, "a", None).memory_bytes();
    let start = |host: &Host, c: testkit::guest::GuestConfig, name: &str| {
        let dir = host.dir().join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let monitor = c.monitor.clone().unwrap();
        let guest = Guest::start(image, c, &dir).unwrap_or_else(|e| panic!("{e}"));
        let m = Monitor::connect(&monitor, Duration::from_secs(10)).unwrap();
        (guest, m)
    };

    // QEMU A on backend 1 (the Host's).
    let socket_a = host.socket.clone();
    let (mut a, mut monitor_a) = start(&host, config(&host, &socket_a, "a", None), "a");
    a.wait_ready().unwrap_or_else(|e| panic!("{e}"));
    a.wait_mark("pinging", Duration::from_secs(60))
        .unwrap_or_else(|e| panic!("{e}"));
    std::thread::sleep(Duration::from_secs(3));

    // A to QEMU B on backend 2.
    let (mut backend_2, socket_b) = host.spawn_backend("backend-2");
    let port = free_port();
    let (b, mut monitor_b) = start(&host, config(&host, &socket_b, "b", Some(port)), "b");
    let took = migrate(
        &mut monitor_a,
        &mut monitor_b,
        port,
        Duration::from_secs(120),
    );
    report(&format!("migration 1 (A to B) took {took:.1?}"));
    let differ = differing_pages(host.dir(), &mut monitor_a, &mut monitor_b, mem);
    assert_same_memory(1, &differ);
    monitor_b.command("cont").unwrap();
    let logging_on = |l: &str| l.contains("dirty logging") && l.contains("true");
    let logged = host
        .backend()
        .out
        .wait_for(0, Instant::now() + Duration::from_secs(5), |l| {
            logging_on(l)
        });
    assert!(
        logged.is_ok(),
        "backend 1 never logged:\n{}",
        host.backend_log()
    );
    backend_2
        .out
        .wait_for(0, Instant::now() + Duration::from_secs(20), |l| {
            l.contains("SEND_RARP: RARP announcement sent")
        })
        .unwrap_or_else(|e| {
            panic!(
                "no RARP from backend 2 ({e:?}):\n{}",
                backend_2.out.tail(30)
            )
        });
    // The source is done with: QEMU A and backend 1 go, as on the host the guest left.
    monitor_a.command("quit").ok();
    drop(a);
    host.kill_backend();
    std::thread::sleep(Duration::from_secs(3));

    // B to QEMU C on backend 3: the second migration, from a backend that was a destination.
    let (mut backend_3, socket_c) = host.spawn_backend("backend-3");
    let port = free_port();
    let (mut c, mut monitor_c) = start(&host, config(&host, &socket_c, "c", Some(port)), "c");
    let took = migrate(
        &mut monitor_b,
        &mut monitor_c,
        port,
        Duration::from_secs(120),
    );
    report(&format!("migration 2 (B to C) took {took:.1?}"));
    let differ = differing_pages(host.dir(), &mut monitor_b, &mut monitor_c, mem);
    assert_same_memory(2, &differ);
    monitor_c.command("cont").unwrap();
    // The log lines come through a reader thread: wait for them.
    let logged = backend_2
        .out
        .wait_for(0, Instant::now() + Duration::from_secs(5), |l| {
            logging_on(l)
        });
    assert!(
        logged.is_ok(),
        "backend 2 never logged:\n{}",
        backend_2.out.tail(30)
    );
    backend_3
        .out
        .wait_for(0, Instant::now() + Duration::from_secs(20), |l| {
            l.contains("SEND_RARP: RARP announcement sent")
        })
        .unwrap_or_else(|e| {
            panic!(
                "no RARP from backend 3 ({e:?}):\n{}",
                backend_3.out.tail(30)
            )
        });
    monitor_b.command("quit").ok();
    drop(b);
    backend_2.kill();

    // The guest finishes its pings on C.
    c.wait_mark("done", Duration::from_secs(150))
        .unwrap_or_else(|e| panic!("{e}\nbackend 3:\n{}", backend_3.out.tail(30)));
    let serial = c.serial();
    let refused: Vec<_> = serial
        .iter()
        .filter(|l| l.contains("lacks") || l.contains("fails to broadcast"))
        .collect();
    assert!(refused.is_empty(), "QEMU C: {refused:?}");
    let (sent, received) =
        ping_counts(&serial).unwrap_or_else(|| panic!("no ping summary:\n{}", serial.join("\n")));
    report(&format!(
        "pings across two migrations: {received} of {sent} answered"
    ));
    assert_eq!(sent, 150);
    assert!(
        serial.iter().any(|l| l.contains("receiver")),
        "iperf3 across the migrations did not finish:\n{}",
        serial.join("\n")
    );
    let ring_errors: Vec<_> = serial
        .iter()
        .filter(|l| l.contains("is not a head") || l.contains("nexpected") || l.contains("broken"))
        .collect();
    assert!(
        ring_errors.is_empty(),
        "guest virtio errors: {ring_errors:?}"
    );
    assert!(
        sent - received <= 10,
        "{} pings lost:\n{}",
        sent - received,
        serial.join("\n")
    );
    drop(c);
    backend_3.kill();
}
