/* artfs public limits and names: what a client of the mount may rely on.
 * The contract itself is DESIGN.md; this header gives its numbers to C. */
#ifndef ARTFS_ARTFS_H
#define ARTFS_ARTFS_H

#include <stdint.h>
#include <sys/ioctl.h>

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
#define ARTFS_KEYS_DIR             ".keys"
#define ARTFS_PUT_NAME             ".put"
#define ARTFS_GET_NAME             ".get"

/* Extended attributes of an R3 object (DESIGN.md §3.3). */
#define ARTFS_XATTR_KEY            "user.artfs.key"
#define ARTFS_XATTR_KIND           "user.artfs.kind"
#define ARTFS_XATTR_DTYPE          "user.artfs.dtype"
#define ARTFS_XATTR_SHAPE          "user.artfs.shape"
#define ARTFS_XATTR_TOKEN_START    "user.artfs.source_token_start"
#define ARTFS_XATTR_SHA256         "user.artfs.payload_sha256"

/* ---- GPU weights (DESIGN.md §4) ------------------------------------------
 *
 * <wv>/weights/rank<k> is opened read-only by an engine, which then calls
 *     ioctl(fd, ARTFS_IOC_ATTACH, &attach)
 * with abi set and the fingerprint it expects filled in. On success the
 * reply part holds the device and the CUDA IPC handles of rank k's slabs;
 * manifest.json says where each tensor lies (slab, offset). The open file is
 * the attachment: GPU memory of unloaded weights is freed only when the
 * last attached file is closed. Errors:
 *     EAGAIN      weights still loading
 *     EIO         the load failed (weights/status says why)
 *     ESTALE      the fingerprint differs from what was loaded
 *     EOPNOTSUPP  quantization not served zero-copy (see allow_quant=)
 *     ENODEV      no GPU support in this build or on this host
 *     EINVAL      unknown abi version
 */
#define ARTFS_ABI_VERSION          1
#define ARTFS_SLABS_MAX            16
#define ARTFS_IPC_HANDLE_SIZE      64    /* sizeof(cudaIpcMemHandle_t) */
#define ARTFS_SLAB_ALIGN           (2u << 20)
#define ARTFS_TENSOR_ALIGN         256u

/* What a checkpoint on a device is; every field must match for an attach. */
struct artfs_fingerprint {
	char architecture[128];          /* config.json architectures[0], or "" */
	char quant_method[64];           /* quantization_config.quant_method, or "" */
	uint8_t quant_config_sha256[32]; /* of the canonical quantization_config JSON */
	uint8_t revision[32];            /* SHA-256 over safetensors headers and file sizes */
	char dtypes[256];                /* sorted dtype names, comma separated */
	uint32_t tp_size;                /* tensor parallel size (1 for replicated weights) */
	uint32_t tp_rank;
	uint32_t cc_major, cc_minor;     /* compute capability of the device */
	uint32_t driver_version;         /* cudaDriverGetVersion() */
	uint32_t reserved;
};

struct artfs_slab {
	uint8_t ipc_handle[ARTFS_IPC_HANDLE_SIZE];
	uint64_t size;                   /* bytes, a multiple of ARTFS_SLAB_ALIGN */
};

struct artfs_attach {
	/* in */
	uint32_t abi;                    /* ARTFS_ABI_VERSION */
	uint32_t flags;                  /* none defined: 0 */
	struct artfs_fingerprint expect;
	/* out */
	uint8_t device_uuid[16];         /* cudaDeviceProp.uuid of the slabs' device */
	uint32_t device_index;           /* the daemon's index of that device */
	uint32_t slab_count;
	uint64_t total_bytes;            /* bytes of tensor data of this rank */
	struct artfs_slab slabs[ARTFS_SLABS_MAX];
};

#define ARTFS_IOC_MAGIC            0xA7  /* private to artfs */
#define ARTFS_IOC_ATTACH           _IOWR(ARTFS_IOC_MAGIC, 1, struct artfs_attach)

#endif /* ARTFS_ARTFS_H */
