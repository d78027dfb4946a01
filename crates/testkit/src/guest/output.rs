//! What a test guest prints on its serial console, parsed: the `@@VN:KIND payload@@` markers
//! of its /init (guest_init.sh), and a whole run's output as a [`GuestRun`]: the script's
//! output and exit code, its results, the interface counters, boot times, the kernel log.

use std::collections::BTreeMap;
use std::time::Duration;

/// Splits `...@@VN:KIND payload@@...` into (KIND, payload).
pub fn marker(line: &str) -> Option<(&str, &str)> {
    let start = line.find("@@VN:")? + 5;
    let rest = &line[start..];
    let body = &rest[..rest.find("@@")?];
    Some(body.split_once(' ').unwrap_or((body, "")))
}

/// What a guest run printed, parsed.
#[derive(Debug, Clone, Default)]
pub struct GuestRun {
    /// Every line of the serial console and QEMU's stderr.
    pub serial: Vec<String>,
    /// The script's output (stdout and stderr), without marker lines.
    pub script_output: Vec<String>,
    /// The script's exit code (137 if the guest-side timeout killed it); -1 if never reported.
    pub script_rc: i32,
    /// `vn_result KEY VALUE` pairs.
    pub results: BTreeMap<String, String>,
    /// Interface → counter name → value, read after the script (sysfs statistics).
    pub stats: BTreeMap<String, BTreeMap<String, u64>>,
    /// The READY marker's fields: if, mac, driver, uptime.
    pub ready: BTreeMap<String, String>,
    /// Guest uptime (seconds) at /init's start, at READY and at DONE.
    pub uptime_init: f64,
    pub uptime_ready: f64,
    pub uptime_done: f64,
    /// Host wall time from QEMU's start to READY, and to QEMU's exit.
    pub wall_ready: Duration,
    pub wall_total: Duration,
    /// The guest kernel log, when printed.
    pub dmesg: Vec<String>,
}

impl GuestRun {
    pub fn parse(lines: &[String]) -> GuestRun {
        let mut run = GuestRun {
            serial: lines.to_vec(),
            script_rc: -1,
            ..GuestRun::default()
        };
        let mut in_script = false;
        let mut in_dmesg = false;
        let uptime = |fields: &BTreeMap<String, String>| {
            fields
                .get("uptime")
                .and_then(|v| v.parse().ok())
                .unwrap_or(f64::NAN)
        };
        for line in lines {
            let Some((kind, payload)) = marker(line) else {
                if in_script {
                    run.script_output.push(line.clone());
                } else if in_dmesg {
                    run.dmesg.push(line.clone());
                }
                continue;
            };
            let fields = key_values(payload);
            match kind {
                "INIT" => run.uptime_init = uptime(&fields),
                "READY" => {
                    run.uptime_ready = uptime(&fields);
                    run.ready = fields;
                }
                "BEGIN" => in_script = true,
                "END" => {
                    in_script = false;
                    run.script_rc = fields.get("rc").and_then(|v| v.parse().ok()).unwrap_or(-1);
                }
                "RESULT" => {
                    if let Some((k, v)) = payload.split_once('=') {
                        run.results.insert(k.to_string(), v.to_string());
                    }
                }
                "STAT" => {
                    let (iface, counters) = payload.split_once(' ').unwrap_or((payload, ""));
                    let counters = key_values(counters)
                        .into_iter()
                        .filter_map(|(k, v)| Some((k, v.parse().ok()?)))
                        .collect();
                    run.stats.insert(iface.to_string(), counters);
                }
                "DMESG-BEGIN" => in_dmesg = true,
                "DMESG-END" => in_dmesg = false,
                "DONE" => run.uptime_done = uptime(&fields),
                _ => {}
            }
        }
        run
    }

    /// A counter of the guest's interface (the first non-loopback one), e.g. "rx_packets".
    pub fn stat(&self, counter: &str) -> u64 {
        let iface = self.ready.get("if").map(String::as_str).unwrap_or("eth0");
        self.stats
            .get(iface)
            .and_then(|c| c.get(counter))
            .copied()
            .unwrap_or_else(|| panic!("no counter {counter} for {iface} in {:?}", self.stats))
    }

    pub fn result(&self, key: &str) -> Option<&str> {
        self.results.get(key).map(String::as_str)
    }

    /// Panics with the script's output (and the kernel log) unless the script exited 0.
    pub fn assert_script_ok(&self) {
        assert_eq!(
            self.script_rc,
            0,
            "guest script failed; output:\n{}\nkernel log:\n{}",
            self.script_output.join("\n"),
            self.dmesg.join("\n")
        );
    }

    /// Panics unless the traffic script's ping lost nothing and iperf3 (both ways) and
    /// sockperf each reported a rate above zero.
    pub fn assert_traffic_ran(&self) {
        assert_eq!(
            self.result("ping_loss"),
            Some("0"),
            "ping lost packets:\n{}",
            self.script_output.join("\n")
        );
        for key in [
            "iperf_guest_tx_mbps",
            "iperf_guest_rx_mbps",
            "sockperf_avg_us",
        ] {
            let value: f64 = self
                .result(key)
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("no {key} in {:?}", self.results));
            assert!(value > 0.0, "{key} = {value}");
        }
    }

    /// One line for the test log: boot and run times.
    pub fn timing(&self) -> String {
        format!(
            "guest uptime: init {:.2} s, ready {:.2} s, done {:.2} s; wall: ready {:.1?}, total {:.1?}",
            self.uptime_init, self.uptime_ready, self.uptime_done, self.wall_ready, self.wall_total
        )
    }
}

fn key_values(payload: &str) -> BTreeMap<String, String> {
    payload
        .split_whitespace()
        .filter_map(|kv| kv.split_once('='))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_markers_amid_kernel_noise() {
        let lines: Vec<String> = [
            "SeaBIOS",
            "@@VN:INIT uptime=1.50@@",
            "@@VN:READY uptime=3.25 if=eth0 mac=52:54:00:12:34:56 driver=virtio_net@@",
            "@@VN:BEGIN@@",
            "PING 10.99.0.1",
            "[    4.1] some kernel line @@VN:RESULT loss=0%@@",
            "@@VN:END rc=0@@",
            "@@VN:STAT eth0 rx_packets=7 tx_packets=14@@",
            "@@VN:DONE uptime=9.00@@",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let run = GuestRun::parse(&lines);
        assert_eq!(run.script_rc, 0);
        assert_eq!(run.script_output, vec!["PING 10.99.0.1".to_string()]);
        assert_eq!(run.result("loss"), Some("0%"));
        assert_eq!(run.stat("tx_packets"), 14);
        assert_eq!(run.stat("rx_packets"), 7);
        assert_eq!(run.ready["driver"], "virtio_net");
        assert!((run.uptime_ready - 3.25).abs() < 1e-9);
    }
}
