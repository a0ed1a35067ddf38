/* SPDX-License-Identifier: Apache-2.0 */
#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "format/key.h"
#include "lib/sha256.h"

static bool is_alnum(char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9');
}

bool key_version_name_valid(const char *name)
{
	size_t n = strnlen(name, ARTFS_VERSION_NAME_MAX + 1);

	if (n == 0 || n > ARTFS_VERSION_NAME_MAX || !is_alnum(name[0]))
		return false;
	for (size_t i = 1; i < n; i++)
		if (!is_alnum(name[i]) && name[i] != '.' && name[i] != '_' && name[i] != '-')
			return false;
	return true;
}

/* A digit's value plus one; 0 for anything else (uppercase is not the
 * canonical name of a hash). A table: a batch decodes two keys a record. */
static const uint8_t hex_plus_one[256] = {
	['0'] = 1, ['1'] = 2, ['2'] = 3, ['3'] = 4, ['4'] = 5, ['5'] = 6, ['6'] = 7, ['7'] = 8,
	['8'] = 9, ['9'] = 10, ['a'] = 11, ['b'] = 12, ['c'] = 13, ['d'] = 14, ['e'] = 15,
	['f'] = 16,
};

bool key_is_hex(const void *p, size_t n)
{
	const uint8_t *c = p;
	unsigned bad = 0;

	for (size_t i = 0; i < n; i++)
		bad |= hex_plus_one[c[i]] == 0;
	return !bad;
}

static int hex_decode(const char *hex, size_t digits, uint8_t *out)
{
	const uint8_t *c = (const uint8_t *)hex;
	unsigned bad = 0;

	for (size_t i = 0; i < digits / 2; i++) {
		unsigned hi = hex_plus_one[c[2 * i]], lo = hex_plus_one[c[2 * i + 1]];
		bad |= (hi == 0) | (lo == 0);
		out[i] = (uint8_t)((hi - 1) << 4 | ((lo - 1) & 15));
	}
	return bad ? -EINVAL : 0;
}

int key_hash_decode(const char *name, uint8_t *out, size_t *len)
{
	size_t n = strnlen(name, ARTFS_HASH_HEX_MAX + 1);

	if (n < ARTFS_HASH_HEX_MIN || n > ARTFS_HASH_HEX_MAX || n % 2)
		return -EINVAL;
	if (hex_decode(name, n, out) < 0)
		return -EINVAL;
	*len = n / 2;
	return 0;
}

int key_sha256_decode(const char *hex, uint8_t out[32])
{
	if (strnlen(hex, 65) != 64)
		return -EINVAL;
	return hex_decode(hex, 64, out);
}

void key_hex(const uint8_t *bytes, size_t len, char *out)
{
	static const char digits[] = "0123456789abcdef";

	for (size_t i = 0; i < len; i++) {
		out[2 * i] = digits[bytes[i] >> 4];
		out[2 * i + 1] = digits[bytes[i] & 15];
	}
	out[2 * len] = '\0';
}

static void be64(uint64_t v, uint8_t out[8])
{
	for (int i = 7; i >= 0; i--) {
		out[i] = (uint8_t)(v & 0xff);
		v >>= 8;
	}
}

void key_derive(const char *wv, const uint8_t *hash, size_t hash_len,
		char out[ARTFS_KEY_LEN + 1])
{
	uint8_t msg[8 + ARTFS_VERSION_NAME_MAX + 8 + ARTFS_HASH_BYTES_MAX], digest[32];
	size_t wv_len = strnlen(wv, ARTFS_VERSION_NAME_MAX), n = 0;

	be64(wv_len, msg);
	memcpy(msg + 8, wv, wv_len);
	n = 8 + wv_len;
	be64(hash_len, msg + n);
	memcpy(msg + n + 8, hash, hash_len);
	n += 8 + hash_len;
	sha256_once(msg, n, digest);
	memcpy(out, ARTFS_KEY_PREFIX, sizeof(ARTFS_KEY_PREFIX) - 1);
	key_hex(digest, 32, out + sizeof(ARTFS_KEY_PREFIX) - 1);
}
