/*
 * The cost of one blocking eventfd wake-up across two CPUs: what a driver or device that
 * sleeps for its peer's notification pays each time (docs/PERFORMANCE.md, "What bounds the
 * figures"; the runs, with gen's interrupt mode, in docs/PERFORMANCE-HISTORY.md). Two threads
 * pinned to CPUs 0 and 1 pass a token back and forth through two eventfds with blocking
 * reads; a wake-up is half a round trip.
 *
 *   cc -O2 -pthread -o /tmp/wake-latency scripts/wake-latency.c && /tmp/wake-latency [ROUNDS]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

static int to_peer, to_main;
static long rounds = 20000;

static void pin(int cpu)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	if (pthread_setaffinity_np(pthread_self(), sizeof s, &s) != 0) {
		fprintf(stderr, "cannot pin to CPU %d\n", cpu);
		exit(1);
	}
}

static void pass(int fd)
{
	uint64_t v = 1;
	if (write(fd, &v, sizeof v) != sizeof v)
		exit(1);
}

static void take(int fd)
{
	uint64_t v;
	if (read(fd, &v, sizeof v) != sizeof v)
		exit(1);
}

static void *peer(void *arg)
{
	(void)arg;
	pin(1);
	for (long i = 0; i < rounds; i++) {
		take(to_peer);
		pass(to_main);
	}
	return NULL;
}

int main(int argc, char **argv)
{
	if (argc > 1)
		rounds = atol(argv[1]);
	to_peer = eventfd(0, 0);
	to_main = eventfd(0, 0);
	pthread_t t;
	pthread_create(&t, NULL, peer, NULL);
	pin(0);
	usleep(100000);
	struct timespec s, e;
	clock_gettime(CLOCK_MONOTONIC, &s);
	for (long i = 0; i < rounds; i++) {
		pass(to_peer);
		take(to_main);
	}
	clock_gettime(CLOCK_MONOTONIC, &e);
	pthread_join(t, NULL);
	double us = ((e.tv_sec - s.tv_sec) * 1e9 + (e.tv_nsec - s.tv_nsec)) / 1e3 / rounds;
	printf("%ld round trips: %.1f us each, one wake-up %.1f us\n", rounds, us, us / 2);
	return 0;
}
