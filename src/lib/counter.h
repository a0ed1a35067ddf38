/* SPDX-License-Identifier: Apache-2.0 */
/* A counter of the metrics (.artfs/metrics): an atomic, bumped from any
 * thread without a lock. Every folder's counters are of this type. */
#ifndef ARTFS_COUNTER_H
#define ARTFS_COUNTER_H

#include <stdatomic.h>
#include <stdint.h>

typedef _Atomic uint64_t counter_t;

static inline void counter_inc(counter_t *c)
{
	atomic_fetch_add_explicit(c, 1, memory_order_relaxed);
}

static inline void counter_add(counter_t *c, uint64_t n)
{
	atomic_fetch_add_explicit(c, n, memory_order_relaxed);
}

#endif
