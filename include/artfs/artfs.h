/* SPDX-License-Identifier: Apache-2.0 */
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
 * reply part holds the device, the sizes of rank k's slabs and a token;
 * manifest.json says where each tensor lies (slab, offset). The slabs
 * themselves are CUDA VMM allocations (cuMemCreate) whose POSIX file
 * descriptors the engine receives on the mount's socket .artfs/attach:
 *
 *     s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0)
 *     connect(s, "<mnt>/.artfs/attach")
 *     send(s, struct artfs_slabs_request { magic, abi, token })
 *     recvmsg(s) -> struct artfs_slabs_reply, and with it (SCM_RIGHTS)
 *                   one descriptor per slab, in slab order
 *
 * then, per slab, cuMemImportFromShareableHandle(fd,
 * CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR), cuMemAddressReserve, cuMemMap,
 * cuMemSetAccess, and closes the descriptor (the mapping keeps the memory).
 * libartfs and the Python client do all of this. A token serves one
 * request, for 30 s, and only while the file that asked for it is open; a
 * reply's error is 0 or a negative errno:
 *     -ENOENT     no such token (used, expired, its file closed, or asked of
 *                 a daemon that died since: ioctl again)
 *     -ESTALE     the weights were unloaded since
 *     -EPROTO     not a request of this wire
 *
 * The reply's layout is the digest of the rank's layout (manifest.json's
 * ranks[k].layout): the same tensors (names, dtypes, shapes, ties) lie at
 * the same offsets in every version, loaded or published. An engine that
 * mapped the slabs into an address range of its own can map another
 * version of the same layout there (flip in place, DESIGN.md §4.3): it
 * needs nothing of the daemon but this attach, and compares the layout
 * before it fetches a descriptor (libartfs: artfs_weights_flip, EXDEV for
 * another layout).
 *
 * The memory outlives the daemon that loaded it (DESIGN.md §8): the daemon's
 * holder keeps a descriptor of every slab, an engine's mapping stays valid
 * across a crash or an upgrade of the daemon, and the next daemon serves
 * the same slabs. GPU memory of unloaded weights is freed once the daemon
 * has let go of it and every engine has unmapped it (or ended).
 * ioctl errors:
 *     EAGAIN      weights still loading
 *     EIO         the load failed (weights/status says why)
 *     ESTALE      the fingerprint differs from what was loaded
 *     EOPNOTSUPP  quantization not served zero-copy (see allow_quant=)
 *     ENODEV      no GPU support in this build or on this host
 *     EINVAL      unknown abi version; an engine of ABI 1 (CUDA IPC handles,
 *                 artfs 0.1) gets EINVAL for ARTFS_IOC_ATTACH_V1 and a log
 *                 line: rebuild it against this libartfs
 */
#define ARTFS_ABI_VERSION          2
#define ARTFS_SLABS_MAX            16
#define ARTFS_IPC_HANDLE_SIZE      64    /* sizeof(cudaIpcMemHandle_t): publish blobs */
#define ARTFS_SLAB_ALIGN           (2u << 20)
#define ARTFS_TENSOR_ALIGN         256u
#define ARTFS_ATTACH_TOKEN_SIZE    32
#define ARTFS_ATTACH_SOCKET        "attach"  /* <mnt>/.artfs/attach */
#define ARTFS_SLABS_MAGIC          0x534c5441u  /* "ATLS" */
#define ARTFS_LAYOUT_SIZE          32    /* SHA-256 of a rank's layout */

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
	uint64_t slab_size[ARTFS_SLABS_MAX]; /* bytes, multiples of ARTFS_SLAB_ALIGN */
	uint8_t token[ARTFS_ATTACH_TOKEN_SIZE]; /* for .artfs/attach */
	uint8_t layout[ARTFS_LAYOUT_SIZE]; /* the slab's layout digest (manifest.json's
	                                    * ranks[k].layout); 0s from a daemon before
	                                    * layouts: no flip in place (artfs 0.1.0's
	                                    * reserved[4], which it zeroed) */
};

/* On .artfs/attach (SOCK_SEQPACKET): one request, one reply, per connection. */
struct artfs_slabs_request {
	uint32_t magic;                  /* ARTFS_SLABS_MAGIC */
	uint32_t abi;                    /* ARTFS_ABI_VERSION */
	uint8_t token[ARTFS_ATTACH_TOKEN_SIZE];
};

struct artfs_slabs_reply {
	uint32_t magic;                  /* ARTFS_SLABS_MAGIC */
	int32_t error;                   /* 0, or a negative errno (no descriptors) */
	uint32_t slab_count;             /* descriptors that came with the reply */
	uint32_t reserved;
	uint64_t slab_size[ARTFS_SLABS_MAX];
};

/* ABI 1 (artfs 0.1: slabs shared as CUDA IPC handles), no longer served;
 * kept so that the daemon can tell such an engine what it meets. */
struct artfs_slab_v1 {
	uint8_t ipc_handle[ARTFS_IPC_HANDLE_SIZE];
	uint64_t size;
};

struct artfs_attach_v1 {
	uint32_t abi;
	uint32_t flags;
	struct artfs_fingerprint expect;
	uint8_t device_uuid[16];
	uint32_t device_index;
	uint32_t slab_count;
	uint64_t total_bytes;
	struct artfs_slab_v1 slabs[ARTFS_SLABS_MAX];
};

#ifndef __cplusplus
_Static_assert(sizeof(struct artfs_fingerprint) == 536, "fingerprint ABI");
_Static_assert(sizeof(struct artfs_attach) == 768, "attach ABI 2");
_Static_assert(sizeof(struct artfs_slabs_request) == 40, "slabs request");
_Static_assert(sizeof(struct artfs_slabs_reply) == 144, "slabs reply");
#endif

/* ---- GPU-direct publish (DESIGN.md §4.3) ------------------------------------
 *
 * A process that holds a version's tensors on its own GPU (a trainer, or an
 * engine after its post-processing) publishes them as <wv> without disk or
 * host memory:
 *
 *     mkdir <mnt>/<wv>/weights           (an empty weights/ that takes publishes)
 *     fd = open(<mnt>/<wv>/weights/.publish, O_WRONLY)  (or O_RDWR)
 *     write(fd, blob, len)               (any number of writes, in order)
 *     fsync(fd)                          -> the result; close() returns it too
 *
 * The daemon opens the CUDA IPC handles, copies every tensor device to
 * device (peer to peer when the target GPU is another one) into a slab of
 * its own, and returns only when the copy is complete: the publisher may
 * free or overwrite its tensors as soon as fsync returns 0. Opened O_RDWR,
 * a read after fsync returns one line: "0 <tensors> <bytes> <seconds>\n" or
 * "<errno name> <reason>\n". The publisher must have finished writing the
 * tensors (cudaDeviceSynchronize or a stream sync) before it sends the blob.
 *
 * The blob is little-endian, fixed-width, pointer-free:
 *
 *     struct artfs_publish_header            (header_size bytes)
 *     struct artfs_publish_handle [handle_count]
 *     struct artfs_publish_tensor [tensor_count]   (tensor_size bytes each)
 *
 * and its length must be exactly that. Each IPC handle (cudaIpcGetMemHandle
 * of an allocation's base) is listed once; a tensor names its handle by
 * index and its bytes by an offset into that allocation. Tensors with the
 * same handle, offset and size (tied parameters) are stored once and share
 * one slab offset in the manifest. A version of tp_size ranks takes one
 * publish per rank; it is ready (manifest.json, attachable) once every rank
 * has been published. The result is a version like a loaded one: manifest
 * (layout "gpu-direct"), fingerprint (revision = SHA-256 of the tensor
 * table: names, dtypes, shapes, in blob order), rank<k>; status says
 * "source = gpu-direct from GPU <uuid>".
 *
 * Every field is checked. Errors (fsync and close):
 *     EBADMSG  malformed: magic, sizes, counts, a name empty or not
 *              NUL-terminated or given twice, an unknown dtype, ndim > 8,
 *              size != prod(shape) * itemsize, a handle index out of range,
 *              a handle listed twice or not openable, offset + size beyond
 *              the handle's allocation, a truncated or overlong blob
 *     EINVAL   abi unknown, rank >= tp_size, tp_size differing from the
 *              version's earlier ranks, no such target GPU
 *     ENOMEM   the target GPU lacks room (nothing else is touched)
 *     EEXIST   the version already has loaded weights, or this rank
 *     ENODEV   no GPU support, or the source GPU is not one of the daemon's
 *     EIO      a CUDA copy failed
 */
#define ARTFS_PUBLISH_MAGIC        0x50545241u  /* "ARTP" */
#define ARTFS_PUBLISH_ABI          1
#define ARTFS_PUBLISH_NAME         ".publish"
#define ARTFS_PUBLISH_NAME_MAX     256   /* bytes of a tensor name, NUL included */
#define ARTFS_PUBLISH_DTYPE_MAX    16    /* a safetensors dtype name ("BF16"), NUL-padded */
#define ARTFS_PUBLISH_HANDLES_MAX  65536u
#define ARTFS_PUBLISH_TENSORS_MAX  1048576u
#define ARTFS_PUBLISH_TARGET_SOURCE (-1) /* target_device: the source's GPU */

struct artfs_publish_header {
	uint32_t magic;                  /* ARTFS_PUBLISH_MAGIC */
	uint32_t abi;                    /* ARTFS_PUBLISH_ABI */
	uint32_t header_size;            /* sizeof(struct artfs_publish_header) = 256 */
	uint32_t tensor_size;            /* sizeof(struct artfs_publish_tensor) = 360 */
	uint32_t handle_count;           /* 1 .. ARTFS_PUBLISH_HANDLES_MAX */
	uint32_t tensor_count;           /* 1 .. ARTFS_PUBLISH_TENSORS_MAX */
	uint32_t rank;                   /* this blob's rank, < tp_size */
	uint32_t tp_size;                /* ranks of the version, >= 1 */
	int32_t target_device;           /* the daemon's GPU index, or ARTFS_PUBLISH_TARGET_SOURCE */
	uint32_t flags;                  /* none defined: 0 */
	uint8_t source_uuid[16];         /* cudaDeviceProp.uuid of the handles' GPU */
	char architecture[128];          /* for the fingerprint, NUL-terminated, or "" */
	char quant_method[64];           /* likewise ("" = unquantized) */
	uint8_t reserved[8];             /* 0 */
};

struct artfs_publish_handle {
	uint8_t ipc_handle[ARTFS_IPC_HANDLE_SIZE];  /* cudaIpcMemHandle_t */
};

struct artfs_publish_tensor {
	char name[ARTFS_PUBLISH_NAME_MAX];   /* NUL-terminated, NUL-padded, 1..255 bytes */
	char dtype[ARTFS_PUBLISH_DTYPE_MAX]; /* "BF16", "F32", "F8_E4M3", ... */
	uint32_t ndim;                       /* 0 .. ARTFS_NDIM_MAX */
	uint32_t handle;                     /* index into the handles */
	uint64_t shape[ARTFS_NDIM_MAX];      /* unused dimensions 0 */
	uint64_t offset;                     /* bytes into the handle's allocation */
	uint64_t size;                       /* bytes: prod(shape) * itemsize (C order, contiguous) */
};

#ifndef __cplusplus
_Static_assert(sizeof(struct artfs_publish_header) == 256, "publish header ABI");
_Static_assert(sizeof(struct artfs_publish_handle) == 64, "publish handle ABI");
_Static_assert(sizeof(struct artfs_publish_tensor) == 360, "publish tensor ABI");
#endif

#define ARTFS_IOC_MAGIC            0xA7  /* private to artfs */
#define ARTFS_IOC_ATTACH_V1        _IOWR(ARTFS_IOC_MAGIC, 1, struct artfs_attach_v1)
#define ARTFS_IOC_ATTACH           _IOWR(ARTFS_IOC_MAGIC, 2, struct artfs_attach)

#endif /* ARTFS_ARTFS_H */
