//! SEND_RARP on a real TAP: after a migration the destination's frontend asks the backend to
//! announce the guest's MAC, and a broadcast RARP request from that MAC leaves through the
//! TAP, as if the guest had sent it: a packet socket on the TAP's host side receives it.
//!
//! Needs root (a network namespace with a TAP); skips with a printed reason otherwise.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::time::Duration;

use testkit::inproc::{tap_backend, Backend};
use testkit::netns::{NetNs, TapSpec};
use testkit::packages;
use testkit::raw::RawFrontend;
use vhost::vhost_user::message::FrontendReq;
use vring::{Features, GuestAddress};

const TEST: &str = "rarp";

fn backend(ns: &NetNs, tap: &TapSpec) -> Backend {
    tap_backend(ns, "rarp", &tap.name)
}

/// A packet socket in `ns` receiving RARP frames on `ifname`, with a receive timeout.
fn rarp_socket(ns: &NetNs, ifname: &str) -> OwnedFd {
    ns.run(|| {
        let proto = (virtnet_backend::rarp::ETH_P_RARP).to_be();
        // SAFETY: plain socket(2) call; the result is checked.
        let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto as i32) };
        assert!(
            fd >= 0,
            "packet socket: {}",
            std::io::Error::last_os_error()
        );
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        let sock = unsafe { OwnedFd::from_raw_fd(fd) };
        let name = std::ffi::CString::new(ifname).unwrap();
        // SAFETY: `name` is a NUL-terminated string alive for the call.
        let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
        assert!(index > 0, "no interface {ifname}");
        // SAFETY: sockaddr_ll is plain old data; all-zero is valid.
        let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        addr.sll_family = libc::AF_PACKET as u16;
        addr.sll_protocol = proto;
        addr.sll_ifindex = index as i32;
        // SAFETY: `addr` is a sockaddr_ll of the size given, alive for the call.
        let r = unsafe {
            libc::bind(
                sock.as_raw_fd(),
                (&addr as *const libc::sockaddr_ll).cast(),
                std::mem::size_of::<libc::sockaddr_ll>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0, "bind: {}", std::io::Error::last_os_error());
        let tv = libc::timeval {
            tv_sec: 5,
            tv_usec: 0,
        };
        // SAFETY: SO_RCVTIMEO takes a timeval, and `tv` is one, alive for the call.
        let r = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            )
        };
        assert_eq!(r, 0);
        sock
    })
}

#[test]
fn send_rarp_broadcasts_the_guests_mac_out_of_the_tap() {
    if !packages::netns_ready(TEST) {
        return;
    }
    let ns = NetNs::create("rarp").expect("network namespace");
    let tap = TapSpec::for_backend();
    ns.add_tap(&tap).expect("TAP in the namespace");
    let b = backend(&ns, &tap);
    let sock = rarp_socket(&ns, &tap.name);
    let f = RawFrontend::connect(
        &b.socket,
        2,
        Features::VERSION_1,
        &[(GuestAddress(0), 1 << 20)],
    );
    f.set_mem_table();
    let mac = [0x52, 0x54, 0x00, 0x0a, 0x0b, 0x0c];
    let mut payload = [0u8; 8];
    payload[..6].copy_from_slice(&mac);
    // With NEED_REPLY the ack says it went out; QEMU sends it without (no answer then).
    assert_eq!(f.send_raw(FrontendReq::SEND_RARP, &payload, true), Some(0));
    let mut frame = [0u8; 1514];
    // SAFETY: `frame` is writable for its length during the call.
    let n = unsafe { libc::recv(sock.as_raw_fd(), frame.as_mut_ptr().cast(), frame.len(), 0) };
    assert!(n > 0, "no RARP frame: {}", std::io::Error::last_os_error());
    let frame = &frame[..n as usize];
    assert_eq!(frame, &virtnet_backend::rarp::frame(mac)[..]);
    assert_eq!(f.send_raw(FrontendReq::SEND_RARP, &payload, false), None);
    // The connection goes on: a request the crate handles is still answered.
    assert!(vhost::VhostBackend::get_features(&f.frontend).is_ok());
    std::thread::sleep(Duration::from_millis(50));
    let rx = ns.stats(&tap.name).unwrap()["rx_packets"];
    assert_eq!(rx, 2, "two announcements through the TAP");
    drop(f);
}
