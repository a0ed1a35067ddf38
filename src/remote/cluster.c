/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "lib/log.h"
#include "remote/cluster.h"

uint16_t cluster_crc16(const void *buf, size_t len)
{
	const uint8_t *p = buf;
	uint16_t crc = 0;

	for (size_t i = 0; i < len; i++) {
		crc ^= (uint16_t)(p[i] << 8);
		for (int b = 0; b < 8; b++)
			crc = crc & 0x8000 ? (uint16_t)(crc << 1 ^ 0x1021) : (uint16_t)(crc << 1);
	}
	return crc;
}

unsigned cluster_key_slot(const void *key, size_t len)
{
	const char *k = key;
	const char *open = memchr(k, '{', len);

	if (open) {
		size_t start = (size_t)(open - k) + 1;
		const char *close = memchr(open + 1, '}', len - start);
		if (close && close > open + 1)
			return cluster_crc16(open + 1, (size_t)(close - open - 1)) & (CLUSTER_SLOTS - 1);
	}
	return cluster_crc16(k, len) & (CLUSTER_SLOTS - 1);
}

int cluster_addr_parse(const char *text, size_t len, struct cluster_addr *out)
{
	const char *host = text, *port;
	size_t host_len;

	if (len > 0 && text[0] == '[') {
		const char *close = memchr(text, ']', len);
		if (!close || close + 1 >= text + len || close[1] != ':')
			return -EINVAL;
		host = text + 1;
		host_len = (size_t)(close - host);
		port = close + 2;
	} else {
		const char *colon = NULL;
		for (size_t i = 0; i < len; i++)
			if (text[i] == ':')
				colon = text + i;
		if (!colon)
			return -EINVAL;
		host_len = (size_t)(colon - text);
		port = colon + 1;
	}
	size_t port_len = len - (size_t)(port - text);
	if (host_len == 0 || host_len > CLUSTER_HOST_MAX || port_len == 0 || port_len > 5)
		return -EINVAL;
	for (size_t i = 0; i < host_len; i++)
		if ((unsigned char)host[i] <= ' ' || host[i] == ',' || host[i] == 0x7f)
			return -EINVAL;
	long p = 0;
	for (size_t i = 0; i < port_len; i++) {
		if (port[i] < '0' || port[i] > '9')
			return -EINVAL;
		p = p * 10 + (port[i] - '0');
	}
	if (p < 1 || p > 65535)
		return -EINVAL;
	memcpy(out->host, host, host_len);
	out->host[host_len] = '\0';
	out->port = (int)p;
	return 0;
}

int cluster_seeds_parse(const char *text, struct cluster_addr **out, size_t *n)
{
	size_t cap = 1;

	for (const char *c = text; *c; c++)
		cap += *c == ',';
	struct cluster_addr *addrs = calloc(cap, sizeof(*addrs));
	if (!addrs)
		return -ENOMEM;
	size_t count = 0;
	const char *entry = text;
	for (;;) {
		const char *end = strchr(entry, ',');
		size_t len = end ? (size_t)(end - entry) : strlen(entry);
		const char *s = entry;
		while (len && (*s == ' ' || *s == '\t'))
			s++, len--;
		while (len && (s[len - 1] == ' ' || s[len - 1] == '\t'))
			len--;
		if (cluster_addr_parse(s, len, &addrs[count]) < 0) {
			log_err("remote=%s: \"%.*s\" is not host:port (port 1..65535)", text,
				(int)len, s);
			free(addrs);
			return -EINVAL;
		}
		count++;
		if (!end)
			break;
		entry = end + 1;
	}
	*out = addrs;
	*n = count;
	return 0;
}
