/*
 * The one-syscall-per-frame ceiling of a TAP, for scripts/tap-compare.sh --ceiling: what a
 * device that makes one system call per frame can reach at best on this machine.
 *
 *   tap-ceiling write IFNAME SIZE SECONDS   one writev (12-byte virtio-net header + a SIZE-byte
 *                                           UDP frame) per frame, in a loop
 *   tap-ceiling tso   IFNAME SIZE SECONDS   the same with a SIZE-byte TCPv4 super-frame asking
 *                                           for TSO (gso_size 1448), as virtnet gen --gso tcp
 *   tap-ceiling uso   IFNAME SIZE SECONDS   a SIZE-byte UDPv4 super-frame asking for USO
 *                                           (gso_size 1472), as virtnet gen --gso udp
 *   tap-ceiling read  IFNAME SECONDS        one blocking read per frame, in a loop
 *
 * write, tso and uso take an optional BUFFERS after SECONDS: the frame is copied into that
 * many buffers, written in turn, so that the kernel's copies read as much distinct memory as
 * a device's do from a guest's ring of buffers (64 super-frames are 4 MiB: the bytes Linux
 * 6.18 lets one TCP flow keep queued, tcp_limit_output_bytes). Without it (1) the frame stays
 * in this CPU's caches, as no guest's frames are.
 *
 * With io_uring (built with -DHAVE_URING -luring, when liburing is installed), the same frames
 * batched: 32 writev per io_uring_enter, or 32 reads kept posted and reaped in bursts:
 *
 *   tap-ceiling uwrite IFNAME SIZE SECONDS  32 writev SQEs, one io_uring_enter to submit
 *                                           and wait for them
 *   tap-ceiling swrite IFNAME SIZE SECONDS  the same with SQPOLL: a kernel thread submits,
 *                                           no io_uring_enter while it is awake
 *   tap-ceiling uread  IFNAME SECONDS       32 readv SQEs posted, each re-posted as it
 *                                           completes, one io_uring_enter per burst
 *
 * The TAP is opened as `virtnet backend` opens it (IFF_TAP | IFF_NO_PI | IFF_VNET_HDR |
 * IFF_MULTI_QUEUE, 12-byte header). The script counts the rates at the TAP's counters; this
 * prints its own totals on exit as a check. Built by the script with cc -O2.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <linux/virtio_net.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>
#ifdef HAVE_URING
#include <liburing.h>
#endif

#ifndef VIRTIO_NET_HDR_GSO_UDP_L4
#define VIRTIO_NET_HDR_GSO_UDP_L4 5 /* Linux 6.2 headers; older ones lack it */
#endif

#define HDR_LEN 12 /* struct virtio_net_hdr_mrg_rxbuf */
#define MAX_FRAME (14 + 65535)

static volatile sig_atomic_t expired;

static void on_alarm(int sig)
{
	(void)sig;
	expired = 1;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec + t.tv_nsec / 1e9;
}

static int open_tap(const char *name)
{
	struct ifreq ifr;
	int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
	int hdr_len = HDR_LEN;

	if (fd < 0) {
		perror("/dev/net/tun");
		exit(1);
	}
	memset(&ifr, 0, sizeof(ifr));
	strncpy(ifr.ifr_name, name, IFNAMSIZ - 1);
	ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR | IFF_MULTI_QUEUE;
	if (ioctl(fd, TUNSETIFF, &ifr) < 0 || ioctl(fd, TUNSETVNETHDRSZ, &hdr_len) < 0) {
		perror(name);
		exit(1);
	}
	return fd;
}

static uint32_t sum16(uint32_t sum, const uint8_t *b, size_t n)
{
	for (size_t i = 0; i + 1 < n; i += 2)
		sum += (uint32_t)b[i] << 8 | b[i + 1];
	if (n & 1)
		sum += (uint32_t)b[n - 1] << 8;
	return sum;
}

static uint16_t fold(uint32_t sum)
{
	while (sum >> 16)
		sum = (sum & 0xffff) + (sum >> 16);
	return sum;
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = v >> 8;
	p[1] = v;
}

/* Ethernet and IPv4 headers of a `len`-byte frame carrying `proto`: 198.18.0.1 -> .2. */
static void eth_ip(uint8_t *f, size_t len, uint8_t proto)
{
	static const uint8_t macs[12] = {0x52, 0x54, 0x00, 0x12, 0x34, 0x56,
					 0x02, 0x00, 0x00, 0x00, 0x00, 0x01};
	memcpy(f, macs, 12);
	put16(f + 12, 0x0800);
	uint8_t *ip = f + 14;
	ip[0] = 0x45;
	put16(ip + 2, len - 14);
	put16(ip + 4, 1);
	ip[6] = 0x40; /* DF */
	ip[8] = 64;
	ip[9] = proto;
	memcpy(ip + 12, (uint8_t[]){198, 18, 0, 1, 198, 18, 0, 2}, 8);
	put16(ip + 10, ~fold(sum16(0, ip, 20)));
}

/* The pseudo-header sum with the L4 length, as Linux leaves it for CHECKSUM_PARTIAL. */
static uint16_t pseudo(const uint8_t *f, size_t len, uint8_t proto)
{
	return fold(sum16(0, f + 26, 8) + proto + (len - 34));
}

#ifdef HAVE_URING
#define BATCH 32

/* 32 writev of the frame per io_uring_enter, until `end`. */
static int uring_write(int fd, struct iovec *iov, size_t len, double end, int sqpoll)
{
	struct io_uring ring;
	struct io_uring_params p;
	unsigned long long frames = 0, bytes = 0, refused = 0;
	memset(&p, 0, sizeof(p));
	if (sqpoll) {
		p.flags = IORING_SETUP_SQPOLL;
		p.sq_thread_idle = 1000;
	}
	int r = io_uring_queue_init_params(4 * BATCH, &ring, &p);
	if (r < 0) {
		fprintf(stderr, "io_uring_queue_init: %s\n", strerror(-r));
		return 1;
	}
	while (now() < end) {
		for (int i = 0; i < BATCH; i++)
			io_uring_prep_writev(io_uring_get_sqe(&ring), fd, iov, 2, 0);
		io_uring_submit_and_wait(&ring, BATCH);
		struct io_uring_cqe *c;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&ring, head, c)
		{
			if (c->res == (int)(HDR_LEN + len)) {
				frames++;
				bytes += len;
			} else if (c->res == -EINVAL) {
				fprintf(stderr, "writev: the TAP refused the header\n");
				return 1;
			} else {
				refused++;
			}
			seen++;
		}
		io_uring_cq_advance(&ring, seen);
	}
	printf("frames %llu bytes %llu refused %llu\n", frames, bytes, refused);
	return 0;
}

/* 32 reads kept posted on a blocking TAP fd until `end`. */
static int uring_read(int fd, double end)
{
	static uint8_t bufs[BATCH][MAX_FRAME + HDR_LEN];
	struct io_uring ring;
	unsigned long long frames = 0, bytes = 0;
	int r = io_uring_queue_init(4 * BATCH, &ring, 0);
	if (r < 0) {
		fprintf(stderr, "io_uring_queue_init: %s\n", strerror(-r));
		return 1;
	}
	for (int i = 0; i < BATCH; i++) {
		struct io_uring_sqe *s = io_uring_get_sqe(&ring);
		io_uring_prep_read(s, fd, bufs[i], sizeof(bufs[i]), 0);
		io_uring_sqe_set_data64(s, i);
	}
	io_uring_submit(&ring);
	while (now() < end) {
		struct __kernel_timespec ts = {.tv_nsec = 100000000};
		struct io_uring_cqe *c;
		if (io_uring_wait_cqe_timeout(&ring, &c, &ts) < 0)
			continue;
		unsigned head, seen = 0;
		io_uring_for_each_cqe(&ring, head, c)
		{
			if (c->res > HDR_LEN) {
				frames++;
				bytes += c->res - HDR_LEN;
			}
			int i = (int)io_uring_cqe_get_data64(c);
			struct io_uring_sqe *s = io_uring_get_sqe(&ring);
			io_uring_prep_read(s, fd, bufs[i], sizeof(bufs[i]), 0);
			io_uring_sqe_set_data64(s, i);
			seen++;
		}
		io_uring_cq_advance(&ring, seen);
		io_uring_submit(&ring);
	}
	printf("frames %llu bytes %llu\n", frames, bytes);
	return 0;
}
#endif

int main(int argc, char **argv)
{
	static uint8_t frame[MAX_FRAME];
	struct virtio_net_hdr_v1 hdr;
	unsigned long long frames = 0, bytes = 0;

	if (argc < 4) {
		fprintf(stderr, "usage: %s write|tso|uso IFNAME SIZE SECONDS [BUFFERS] | read IFNAME SECONDS\n",
			argv[0]);
		return 2;
	}
	const char *mode = argv[1];
	int fd = open_tap(argv[2]);
	memset(&hdr, 0, sizeof(hdr));

#ifdef HAVE_URING
	if (!strcmp(mode, "uread"))
		return uring_read(fd, now() + atof(argv[3]));
#endif
	if (!strcmp(mode, "read")) {
		/* Blocking reads, one per frame and nothing else; the alarm interrupts the last
		 * (no SA_RESTART). */
		struct sigaction sa = {.sa_handler = on_alarm};
		sigaction(SIGALRM, &sa, NULL);
		alarm(atoi(argv[3]));
		while (!expired) {
			ssize_t n = read(fd, frame, sizeof(frame));
			if (n > HDR_LEN) {
				frames++;
				bytes += n - HDR_LEN;
			}
		}
		printf("frames %llu bytes %llu\n", frames, bytes);
		return 0;
	}

	if (argc < 5) {
		fprintf(stderr, "%s: SIZE and SECONDS needed\n", mode);
		return 2;
	}
	size_t len = atoi(argv[3]);
	double end = now() + atof(argv[4]);
	long buffers = argc > 5 ? atol(argv[5]) : 1;
	if (buffers < 1 || buffers > 4096) {
		fprintf(stderr, "BUFFERS %ld outside 1..4096\n", buffers);
		return 2;
	}
	if (len < 60 || len > MAX_FRAME) {
		fprintf(stderr, "SIZE %zu outside 60..%d\n", len, MAX_FRAME);
		return 2;
	}
	int uring = !strcmp(mode, "uwrite") || !strcmp(mode, "swrite");
	if (!strcmp(mode, "write") || !strcmp(mode, "uso") || uring) {
		eth_ip(frame, len, 17);
		put16(frame + 34, 9);
		put16(frame + 36, 9);
		put16(frame + 38, len - 34);
		if (!strcmp(mode, "uso")) {
			put16(frame + 40, pseudo(frame, len, 17));
			hdr.flags = VIRTIO_NET_HDR_F_NEEDS_CSUM;
			hdr.gso_type = VIRTIO_NET_HDR_GSO_UDP_L4;
			hdr.hdr_len = 42;
			hdr.gso_size = 1472;
			hdr.csum_start = 34;
			hdr.csum_offset = 6;
		}
	} else if (!strcmp(mode, "tso")) {
		uint8_t *tcp = frame + 34;
		eth_ip(frame, len, 6);
		put16(tcp, 9);
		put16(tcp + 2, 9);
		tcp[7] = 1;  /* seq */
		tcp[11] = 1; /* ack */
		tcp[12] = 8 << 4;
		tcp[13] = 0x18; /* ACK PSH */
		put16(tcp + 14, 0xffff);
		memcpy(tcp + 20, (uint8_t[]){1, 1, 8, 10, 1, 2, 3, 4, 0, 0, 0, 1}, 12);
		put16(tcp + 16, pseudo(frame, len, 6));
		hdr.flags = VIRTIO_NET_HDR_F_NEEDS_CSUM;
		hdr.gso_type = VIRTIO_NET_HDR_GSO_TCPV4;
		hdr.hdr_len = 66;
		hdr.gso_size = 1448;
		hdr.csum_start = 34;
		hdr.csum_offset = 16;
	} else {
		fprintf(stderr, "unknown mode %s\n", mode);
		return 2;
	}
	struct iovec iov[2] = {{&hdr, HDR_LEN}, {frame, len}};
	if (uring) {
#ifdef HAVE_URING
		return uring_write(fd, iov, len, end, !strcmp(mode, "swrite"));
#else
		fprintf(stderr, "%s: built without liburing\n", mode);
		return 2;
#endif
	}
	/* Each buffer a whole number of pages apart, as a guest's buffers are. */
	size_t stride = (len + 4095) & ~(size_t)4095;
	uint8_t *ring = frame;
	if (buffers > 1) {
		ring = malloc(stride * buffers);
		if (!ring) {
			perror("malloc");
			return 1;
		}
		for (long b = 0; b < buffers; b++)
			memcpy(ring + b * stride, frame, len);
	}
	unsigned long long refused = 0;
	long next = 0;
	for (;;) {
		for (int i = 0; i < 64; i++) {
			iov[1].iov_base = ring + next * stride;
			next = next + 1 == buffers ? 0 : next + 1;
			ssize_t n = writev(fd, iov, 2);
			if (n == (ssize_t)(HDR_LEN + len)) {
				frames++;
				bytes += len;
			} else if (n < 0 && errno == EINVAL) {
				perror("writev: the TAP refused the header");
				return 1;
			} else {
				refused++;
			}
		}
		if (now() >= end)
			break;
	}
	printf("frames %llu bytes %llu refused %llu\n", frames, bytes, refused);
	return 0;
}
