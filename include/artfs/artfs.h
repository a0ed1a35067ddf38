/* artfs public limits and names: what a client of the mount may rely on.
 * The contract itself is DESIGN.md; this header gives its numbers to C. */
#ifndef ARTFS_ARTFS_H
#define ARTFS_ARTFS_H

#include <stdint.h>

/* R3 artifact envelope, schema 3 (DESIGN.md §3.1). */
#define ARTFS_ENVELOPE_SCHEMA      3
#define ARTFS_ENVELOPE_HEADER_MAX  4096u /* bytes of JSON after the u32 length */
#define ARTFS_NDIM_MAX             8
#define ARTFS_KEY_PREFIX           "vllm-artifact/"
#define ARTFS_KEY_LEN              (sizeof(ARTFS_KEY_PREFIX) - 1 + 64)

/* Namespace (DESIGN.md §2). */
#define ARTFS_VERSION_NAME_MAX     128   /* characters of <weight_version> */
#define ARTFS_HASH_HEX_MIN         2     /* hex digits of <block_hash> */
#define ARTFS_HASH_HEX_MAX         128
#define ARTFS_HASH_BYTES_MAX       (ARTFS_HASH_HEX_MAX / 2)
#define ARTFS_INFO_DIR             ".artfs"
#define ARTFS_MATERIALIZE_NAME     ".materialize"

/* Extended attributes of an R3 object (DESIGN.md §3.3). */
#define ARTFS_XATTR_KEY            "user.artfs.key"
#define ARTFS_XATTR_KIND           "user.artfs.kind"
#define ARTFS_XATTR_DTYPE          "user.artfs.dtype"
#define ARTFS_XATTR_SHAPE          "user.artfs.shape"
#define ARTFS_XATTR_TOKEN_START    "user.artfs.source_token_start"
#define ARTFS_XATTR_SHA256         "user.artfs.payload_sha256"

#endif /* ARTFS_ARTFS_H */
