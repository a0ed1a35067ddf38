/* SPDX-License-Identifier: Apache-2.0 */
/* Redis Cluster addressing: the hash slot of a key (CRC16/XMODEM and hash
 * tags, as the Redis Cluster specification defines them) and host:port
 * lists. Pure: no I/O, so the remote client and its tests share it. */
#ifndef ARTFS_CLUSTER_H
#define ARTFS_CLUSTER_H

#include <stddef.h>
#include <stdint.h>

#define CLUSTER_SLOTS    16384
#define CLUSTER_HOST_MAX 255

struct cluster_addr {
	char host[CLUSTER_HOST_MAX + 1];
	int port;
};

/* CRC16-CCITT (XMODEM): polynomial 0x1021, initial value 0. */
uint16_t cluster_crc16(const void *buf, size_t len);

/* Slot of a key: CRC16 of the hash tag (the bytes between the first '{' and
 * the first '}' after it, when not empty), else of the whole key. */
unsigned cluster_key_slot(const void *key, size_t len);

/* "host:port" or "[v6]:port" in len bytes; also Redis's own unbracketed
 * "v6:port" (the port follows the last colon). Returns 0 or -EINVAL. */
int cluster_addr_parse(const char *text, size_t len, struct cluster_addr *out);

/* "host:port[,host:port...]" (spaces around entries allowed) into a malloc'd
 * array. Returns 0, -EINVAL (an empty or malformed entry; logged), or -ENOMEM. */
int cluster_seeds_parse(const char *text, struct cluster_addr **out, size_t *n);

#endif
