//! Real Linux guests on `virtnet switch` (the binary, with its sandbox on), QEMU under TCG:
//! - two guests, each with `virtio-net-pci` on a port of one switch, talk with nothing else in
//!   the path: ping both ways (over IPv6 too, its neighbour discovery's multicast flooded),
//!   sockperf ping-pong, then iperf3 TCP from one to the other, whose super-frames (both
//!   negotiate TSO and checksum offload) cross the switch whole; the
//!   switch's per-port counters agree with what the guests counted; the same with a receiver
//!   that takes no offload (the switch segments in software), with offloads on neither guest
//!   (no super-frame at all), and with two queue pairs each (both pairs carry frames);
//! - a guest reaches the host through the switch's TAP uplink (in a network namespace): ping,
//!   iperf3 both ways, sockperf ping-pong both ways.
//!
//! Needs root (QEMU's packages); skips with a printed reason otherwise
//! (`VIRTNET_GUEST_REQUIRE=1` turns the skip into a failure). Recipe: docs/GUEST.md.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use testkit::guest::{Guest, GuestConfig, GuestImage, GuestRun, Netdev, GUEST_REQUIREMENTS};
use testkit::packages;
use testkit::process::run_checked;
use testkit::report;

const TEST: &str = "guest_switch";
const MAC: [&str; 2] = ["52:54:00:00:00:01", "52:54:00:00:00:02"];
const IP: [&str; 2] = ["10.99.0.1", "10.99.0.2"];
const IP6: [&str; 2] = ["fd99::1", "fd99::2"];

/// Guests share two CPUs with everything else: one test of this file at a time.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The switch process, killed on drop.
struct SwitchProc(Child);

impl Drop for SwitchProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn ctl(socket: &Path, cmd: &str) -> serde_json::Value {
    let out = Command::new(env!("CARGO_BIN_EXE_virtnet"))
        .args(["ctl", "--socket"])
        .arg(socket)
        .arg(cmd)
        .output()
        .expect("virtnet ctl");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("JSON")
}

/// A counter of port `name`'s queue of `kind` in `virtnet ctl ports`.
fn port_counter(ports: &serde_json::Value, name: &str, kind: &str, counter: &str) -> u64 {
    ports["ports"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["name"] == name)
        .flat_map(|p| p["queues"].as_array().unwrap())
        .filter(|q| q["kind"] == kind)
        .map(|q| q[counter].as_u64().unwrap_or(0))
        .sum()
}

/// The guest scripts' sockperf client: `sockperf_ping_pong ADDRESS` runs sockperf ping-pong
/// (UDP) for 2 s against a server at ADDRESS, port 11111, and reports its average latency and
/// p99 as the results `sockperf_avg_us` and `sockperf_p99_us` (read by `Latency::of_guest`).
const SOCKPERF_PING_PONG: &str = r#"
sockperf_ping_pong() {
    sockperf ping-pong -i "$1" -p 11111 -t 2 > /tmp/sockperf.txt 2>&1
    cat /tmp/sockperf.txt
    vn_result sockperf_avg_us "$(sed -n 's/.*avg-latency=\([0-9.]*\).*/\1/p' /tmp/sockperf.txt | head -n 1)"
    vn_result sockperf_p99_us "$(sed -n 's/.*percentile 99.000 = *\([0-9.]*\).*/\1/p' /tmp/sockperf.txt)"
}
"#;

/// What one sockperf ping-pong run measured, in microseconds.
struct Latency {
    avg_us: f64,
    p99_us: f64,
}

impl Latency {
    /// The figures of the guest script's `sockperf_ping_pong`.
    fn of_guest(run: &GuestRun) -> Latency {
        let figure = |key: &str| -> f64 {
            run.result(key)
                .and_then(|us| us.parse().ok())
                .unwrap_or_else(|| panic!("no sockperf figure {key}: {:?}", run.results))
        };
        Latency {
            avg_us: figure("sockperf_avg_us"),
            p99_us: figure("sockperf_p99_us"),
        }
    }

    /// The figures in sockperf ping-pong's own report (a run on the host), found as the guest
    /// script's sed finds them: the number after `avg-latency=` and after `percentile 99.000 =`.
    fn of_report(report: &str) -> Latency {
        let figure = |key: &str| -> f64 {
            report
                .lines()
                .find_map(|line| {
                    let rest = line.split_once(key)?.1.trim_start();
                    let end = rest
                        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                        .unwrap_or(rest.len());
                    rest[..end].parse().ok()
                })
                .unwrap_or_else(|| panic!("no {key} in sockperf's report:\n{report}"))
        };
        Latency {
            avg_us: figure("avg-latency="),
            p99_us: figure("percentile 99.000 ="),
        }
    }

    /// Reports the figures of the ping-pong over `path` and asserts they are plausible: above
    /// zero, and an average under a second (TCG puts it in the hundreds of microseconds; a
    /// pause of the whole machine could add a few long round trips, not thousands).
    fn check(&self, path: &str) {
        report(&format!(
            "sockperf ping-pong {path}: {} us average, {} us p99 (TCG-bound)",
            self.avg_us, self.p99_us
        ));
        assert!(
            self.avg_us > 0.0 && self.avg_us < 1e6 && self.p99_us > 0.0,
            "implausible sockperf latency over {path}: {} us average, {} us p99",
            self.avg_us,
            self.p99_us
        );
    }
}

/// The guest `k`'s script: wait until the other answers, then ping it (with `ipv6`, over
/// IPv6 too); guest 0 serves sockperf and one iperf3 run, guest 1 runs sockperf ping-pong for
/// 2 s, then iperf3.
fn script(k: usize, pairs: u16, ipv6: bool) -> String {
    let wait = r#"
n=0
until ping -c 1 -W 1 "$VN_PEER" > /dev/null 2>&1; do
    n=$((n + 1)); [ "$n" -lt 90 ] || { echo "peer never answered"; exit 1; }
done
ping -c 5 -i 0.2 -W 2 "$VN_PEER" > /tmp/ping.txt || true
cat /tmp/ping.txt
vn_result ping_loss "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/ping.txt)"
"#;
    // Neighbour discovery asks for the peer's address at its solicited-node multicast MAC, a
    // frame the switch floods. (The guests' receive filters stay promiscuous: QEMU answers a
    // vhost-user device's control queue itself.)
    let ping6 = r#"
n=0
until ping -6 -c 1 -W 1 "$VN_PEER6" > /dev/null 2>&1; do
    n=$((n + 1)); [ "$n" -lt 30 ] || { echo "the peer never answered over IPv6"; break; }
done
ping -6 -c 3 -i 0.2 -W 2 "$VN_PEER6" > /tmp/ping6.txt || true
cat /tmp/ping6.txt
vn_result ping6_loss "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/ping6.txt)"
"#;
    let wait = if ipv6 {
        format!("ip addr add \"$VN_IP6\" dev \"$VN_IF\"\n{wait}{ping6}")
    } else {
        wait.to_string()
    };
    if k == 0 {
        // The sockperf server goes once the iperf3 run, which comes after sockperf's, ends.
        let server = r#"
sockperf server -i "${VN_IP%/*}" -p 11111 > /tmp/sockperf.txt 2>&1 &
sockperf=$!
iperf3 -s -1 -p 5201 > /tmp/server.txt 2>&1 &
iperf=$!
"#;
        return format!(
            "{server}{wait}\nwait $iperf\nkill $sockperf\ncat /tmp/server.txt\nsleep 1\n"
        );
    }
    // With -P, the last "receiver" line is the sum of the streams.
    let client = r#"
sleep 1
sockperf_ping_pong "$VN_PEER"
iperf3 -c "$VN_PEER" -p 5201 -t 3 -P STREAMS -f m > /tmp/up.txt
cat /tmp/up.txt
vn_result mbps "$(awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i == "Mbits/sec") m = $(i - 1) } END { print m }' /tmp/up.txt)"
sleep 1
"#;
    format!(
        "{SOCKPERF_PING_PONG}{wait}{}",
        client.replace("STREAMS", &(6 * pairs).to_string())
    )
}

#[test]
fn two_linux_guests_ping_and_run_iperf3_through_virtnet_switch() {
    two_guests(Offloads::Both, 1, true);
}

/// The receiving guest (vm0) takes no offload (`guest_tso4=off,guest_tso6=off,guest_csum=off`,
/// as a guest whose driver does not negotiate them), the sender sends TSO super-frames: the
/// switch finishes their checksums and segments them in software, and the receiver's TCP,
/// which checks every checksum, takes them.
#[test]
fn a_guest_without_offloads_gets_the_other_guests_super_frames_segmented_in_software() {
    two_guests(Offloads::Sender, 1, false);
}

/// Neither guest negotiates an offload (`csum=off`, `guest_csum=off` and the TSO, ECN and UFO
/// properties off on both devices): the sender's TCP segments and checksums every frame
/// itself, and every frame crosses the switch as sent, none larger than the MTU.
#[test]
fn guests_without_offloads_exchange_frames_as_sent() {
    two_guests(Offloads::Neither, 1, false);
}

/// Two queue pairs on each port and two vCPUs in each guest, twelve iperf3 streams (that all
/// hash to one pair of two has odds of 1 in 2048): the switch spreads the flows over the
/// receiver's pairs by their hash, and each pair carries frames.
#[test]
fn guests_with_two_queue_pairs_each_use_both_through_the_switch() {
    two_guests(Offloads::Both, 2, false);
}

/// Which of the two guests' devices negotiate the offloads: the sender is vm1, the receiver
/// vm0.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Offloads {
    Both,
    /// The sender only: the receiver gets its super-frames segmented by the switch.
    Sender,
    Neither,
}

/// The QEMU device properties with which a guest takes no offload from its device.
const NO_GUEST_OFFLOADS: &str =
    ",guest_tso4=off,guest_tso6=off,guest_ecn=off,guest_ufo=off,guest_csum=off";
/// The QEMU device properties with which a guest hands its device no offload to do.
const NO_HOST_OFFLOADS: &str = ",host_tso4=off,host_tso6=off,host_ecn=off,host_ufo=off,csum=off";

impl Offloads {
    /// Guest `k`'s device properties.
    fn device_extra(self, k: usize) -> String {
        match (self, k) {
            (Offloads::Both, _) => String::new(),
            (Offloads::Sender, 0) => NO_GUEST_OFFLOADS.into(),
            (Offloads::Sender, _) => String::new(),
            (Offloads::Neither, _) => format!("{NO_GUEST_OFFLOADS}{NO_HOST_OFFLOADS}"),
        }
    }
}

/// Two guests on one switch, `pairs` queue pairs each (and as many vCPUs), their devices'
/// offloads as `offloads` says; with `ipv6`, IPv6 on in both, and a ping over it.
fn two_guests(offloads: Offloads, pairs: u16, ipv6: bool) {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    if !packages::is_root() {
        packages::skip(TEST, "needs root (apt-get for QEMU)");
        return;
    }
    if let Err(reason) = packages::ensure(GUEST_REQUIREMENTS) {
        packages::skip(TEST, &reason);
        return;
    }
    let image = GuestImage::get().expect("guest image");
    let dir = std::env::temp_dir().join(format!("virtnet-{TEST}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = |k: usize| dir.join(format!("vm{k}.sock"));
    let ctl_sock = dir.join("ctl.sock");
    let log = std::fs::File::create(dir.join("switch.log")).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_virtnet"));
    cmd.arg("switch").arg("--ctl").arg(&ctl_sock);
    for (k, mac) in MAC.iter().enumerate() {
        cmd.arg("--port").arg(format!(
            "name=vm{k},socket={},mac={mac},queues={pairs}",
            sock(k).display()
        ));
    }
    let _switch = SwitchProc(
        cmd.stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("virtnet switch"),
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(sock(1).exists() && ctl_sock.exists()) {
        assert!(Instant::now() < deadline, "the switch never listened");
        std::thread::sleep(Duration::from_millis(50));
    }

    let guests: Vec<Guest> = (0..2)
        .map(|k| {
            let mut c = GuestConfig::vhost_user(&sock(k), &script(k, pairs, ipv6));
            c.netdev = Netdev::VhostUser {
                socket: sock(k),
                queues: pairs,
                reconnect_secs: None,
                server: false,
            };
            c.cpus = u32::from(pairs);
            c.ip = format!("{}/24", IP[k]);
            c.mac = Some(MAC[k].into());
            c.env = vec![("vn_peer".into(), IP[1 - k].into())];
            if ipv6 {
                c.ipv6 = true;
                c.env.push(("vn_ip6".into(), format!("{}/64", IP6[k])));
                c.env.push(("vn_peer6".into(), IP6[1 - k].into()));
            }
            c.device_extra = offloads.device_extra(k);
            let gdir = dir.join(format!("vm{k}"));
            std::fs::create_dir_all(&gdir).unwrap();
            Guest::start(image, c, &gdir).expect("QEMU")
        })
        .collect();
    let runs: Vec<_> = guests
        .into_iter()
        .map(|g| g.finish().expect("guest run"))
        .collect();
    let switch_log = std::fs::read_to_string(dir.join("switch.log")).unwrap_or_default();
    for (k, run) in runs.iter().enumerate() {
        report(&format!("vm{k}: {}", run.timing()));
        report(&format!("vm{k} results: {:?}", run.results));
        if run.script_rc != 0 {
            report(&format!("switch log:\n{switch_log}"));
        }
        run.assert_script_ok();
        assert_eq!(run.result("ping_loss"), Some("0"), "vm{k} lost pings");
        if ipv6 {
            assert_eq!(run.result("ping6_loss"), Some("0"), "vm{k} lost IPv6 pings");
        }
    }
    let mbps: f64 = runs[1]
        .result("mbps")
        .and_then(|m| m.parse().ok())
        .expect("an iperf3 figure");
    report(&format!(
        "iperf3 vm1 -> vm0 through the switch: {mbps} Mbit/s (TCG-bound)"
    ));
    assert!(mbps > 0.0);
    Latency::of_guest(&runs[1]).check("vm1 -> vm0 through the switch");

    // What the guests counted went through the switch's ports: vm1's transmit is vm0's
    // receive, frame for frame (the switch dropped none: no other port, no spoofing).
    let ports = ctl(&ctl_sock, "ports");
    let tx1 = port_counter(&ports, "vm1", "tx", "packets");
    let rx0 = port_counter(&ports, "vm0", "rx", "packets");
    report(&format!("switch: vm1 tx {tx1}, vm0 rx {rx0}"));
    // With TSO on both, the iperf3 stream crossed as super-frames (far fewer frames than
    // 1448-byte segments would take); without, every frame vm0 got fits its MTU.
    if pairs > 1 {
        let per_queue: Vec<u64> = ports["ports"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["name"] == "vm0")
            .flat_map(|p| p["queues"].as_array().unwrap())
            .filter(|q| q["kind"] == "rx")
            .map(|q| q["packets"].as_u64().unwrap_or(0))
            .collect();
        report(&format!("vm0's rx queues: {per_queue:?}"));
        assert_eq!(per_queue.len(), pairs as usize);
        assert!(
            per_queue.iter().all(|&n| n > 100),
            "a pair idle: {per_queue:?}"
        );
    }
    let bytes = port_counter(&ports, "vm0", "rx", "bytes");
    let mean = bytes / rx0.max(1);
    let sent_mean = port_counter(&ports, "vm1", "tx", "bytes") / tx1.max(1);
    report(&format!(
        "mean frame: {sent_mean} bytes from vm1, {mean} bytes to vm0"
    ));
    match offloads {
        Offloads::Both => assert!(
            mean > 1600,
            "mean frame {mean} bytes: super-frames were segmented"
        ),
        Offloads::Sender => {
            assert!(mean <= 1514, "mean frame {mean} bytes: larger than the MTU");
            assert!(rx0 > tx1, "segments: vm0 got {rx0} frames for vm1's {tx1}");
        }
        Offloads::Neither => {
            assert!(sent_mean <= 1514, "vm1 sent {sent_mean}-byte frames");
            assert!(mean <= 1514, "mean frame {mean} bytes: larger than the MTU");
            assert!(
                rx0 <= tx1,
                "vm0 got {rx0} frames for vm1's {tx1}: segmented"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A guest on `virtnet switch --uplink`, the switch and the host's end of the uplink in a
/// network namespace: the guest pings the host's address on the TAP and runs iperf3 TCP to a
/// server there and back (`-R`), its TSO super-frames going out of the uplink whole; then
/// sockperf ping-pong to a server on the host, and from the host to a server in the guest.
#[test]
fn a_linux_guest_reaches_the_host_through_the_switchs_tap_uplink() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    const TEST: &str = "guest_switch_uplink";
    if !packages::is_root() {
        packages::skip(
            TEST,
            "needs root (apt-get, network namespaces, TAP devices)",
        );
        return;
    }
    let mut wanted: Vec<packages::Requirement> = GUEST_REQUIREMENTS.to_vec();
    wanted.push(packages::Requirement::command("ip", "iproute2"));
    if let Err(reason) = packages::ensure(&wanted) {
        packages::skip(TEST, &reason);
        return;
    }
    let image = GuestImage::get().expect("guest image");
    let dir = std::env::temp_dir().join(format!("virtnet-{TEST}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let ns = testkit::netns::NetNs::create("swq").expect("network namespace");
    let tap = testkit::netns::TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP");
    let sock = dir.join("vm.sock");
    let ctl_sock = dir.join("ctl.sock");
    let port = format!("name=vm,socket={},mac={}", sock.display(), MAC[1]);
    let bin = env!("CARGO_BIN_EXE_virtnet");
    let uplink = format!("tap={}", tap.name);
    let argv = [
        bin,
        "switch",
        "--uplink",
        &uplink,
        "--port",
        &port,
        "--ctl",
        ctl_sock.to_str().unwrap(),
    ];
    let _switch = ns
        .spawn(&argv, Some(&dir.join("switch.log")))
        .expect("virtnet switch");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !(sock.exists() && ctl_sock.exists()) {
        assert!(Instant::now() < deadline, "the switch never listened");
        std::thread::sleep(Duration::from_millis(50));
    }
    testkit::inproc::wait_tap_up(&ns, &tap.name);
    let server = ns
        .spawn(
            &[
                "iperf3",
                "-s",
                "-B",
                "10.99.0.1",
                "-p",
                "5201",
                "--forceflush",
            ],
            Some(&dir.join("iperf3.log")),
        )
        .expect("iperf3 server");
    server
        .out
        .wait_for(0, Instant::now() + Duration::from_secs(10), |l| {
            l.contains("Server listening")
        })
        .expect("iperf3 server listening");
    // The guest's ping-pong comes long after the server is up (the guest boots first).
    let sockperf_server = ns
        .spawn(
            &["sockperf", "server", "-i", "10.99.0.1", "-p", "11111"],
            Some(&dir.join("sockperf.log")),
        )
        .expect("sockperf server");
    // After its own ping-pong, the guest serves one from the host until the host connects to
    // port 11112 (busybox nc, which then ends) to say it is done.
    let script = r#"
ping -c 5 -i 0.2 -W 2 "$VN_PEER" > /tmp/ping.txt || true
cat /tmp/ping.txt
vn_result ping_loss "$(sed -n 's/.* \([0-9]*\)% packet loss.*/\1/p' /tmp/ping.txt)"
mbps() { awk '/receiver/ { for (i = 2; i <= NF; i++) if ($i == "Mbits/sec") print $(i - 1) }' "$1"; }
iperf3 -c "$VN_PEER" -p 5201 -t 3 -f m > /tmp/up.txt
cat /tmp/up.txt
vn_result up "$(mbps /tmp/up.txt)"
iperf3 -c "$VN_PEER" -p 5201 -t 3 -f m -R > /tmp/down.txt
cat /tmp/down.txt
vn_result down "$(mbps /tmp/down.txt)"
sockperf_ping_pong "$VN_PEER"
sockperf server -i "${VN_IP%/*}" -p 11111 > /tmp/sockperf-server.txt 2>&1 &
server=$!
nc -l -p 11112 < /dev/null > /dev/null &
told=$!
sleep 1
vn_mark sockperf-server
wait $told
kill $server
sleep 1
"#;
    let mut c = GuestConfig::vhost_user(&sock, &format!("{SOCKPERF_PING_PONG}{script}"));
    c.mac = Some(MAC[1].into());
    let guest_ip = c.ip.split('/').next().unwrap().to_string();
    let gdir = dir.join("vm");
    std::fs::create_dir_all(&gdir).unwrap();
    let mut guest = Guest::start(image, c, &gdir).expect("QEMU");
    // READY first, so the run's timing has the boot and not the wait for the mark.
    guest.wait_ready().expect("guest ready");
    guest
        .wait_mark("sockperf-server", Duration::from_secs(150))
        .expect("the guest's sockperf server");
    let mut ping_pong = ns.command("sockperf");
    ping_pong.args(["ping-pong", "-i", &guest_ip, "-p", "11111", "-t", "2"]);
    let host_report = run_checked("sockperf", ping_pong, Duration::from_secs(60));
    // Whatever the host's run did, the guest may end.
    ns.run(|| std::net::TcpStream::connect((guest_ip.as_str(), 11112)))
        .expect("telling the guest the host's ping-pong is done");
    let run = guest.finish().expect("guest run");
    report(&run.timing());
    report(&format!("results: {:?}", run.results));
    if run.script_rc != 0 {
        let log = std::fs::read_to_string(dir.join("switch.log")).unwrap_or_default();
        report(&format!("switch log:\n{log}"));
    }
    run.assert_script_ok();
    assert_eq!(run.result("ping_loss"), Some("0"), "pings lost");
    for way in ["up", "down"] {
        let mbps: f64 = run
            .result(way)
            .and_then(|m| m.parse().ok())
            .unwrap_or_else(|| panic!("no iperf3 figure {way}"));
        report(&format!(
            "iperf3 {way} through the uplink: {mbps} Mbit/s (TCG-bound)"
        ));
        assert!(mbps > 0.0);
    }
    Latency::of_guest(&run).check("guest -> host through the uplink");
    Latency::of_report(&host_report.unwrap_or_else(|e| panic!("{e}")))
        .check("host -> guest through the uplink");
    let ports = ctl(&ctl_sock, "ports");
    let out = ports["uplink"]["out"]["packets"].as_u64().unwrap();
    let into = ports["uplink"]["in"]["packets"].as_u64().unwrap();
    report(&format!("uplink: {out} frames out, {into} in"));
    assert!(out > 1000 && into > 1000, "{ports}");
    drop((server, sockperf_server));
    let _ = std::fs::remove_dir_all(&dir);
}
