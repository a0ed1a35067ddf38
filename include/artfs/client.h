/* SPDX-License-Identifier: Apache-2.0 */
/* libartfs: attach preloaded GPU weights from an artfs mount.
 *
 *   struct artfs_fingerprint fp;
 *   artfs_fingerprint(ckpt_dir, tp_size, tp_rank, device, &fp, err, sizeof err);
 *   struct artfs_weights *w;
 *   artfs_weights_attach("/mnt/artifacts", "default", rank, &fp, &w, err, sizeof err);
 *   const struct artfs_tensor *t = artfs_weights_find(w, "model.embed_tokens.weight");
 *   ... t->data is a device pointer on the engine's current CUDA device ...
 *   artfs_weights_detach(w);
 *
 * Functions return 0 or a negative errno and say why in err. The attach
 * errnos are those of ARTFS_IOC_ATTACH (artfs/artfs.h); -ENOENT: no such
 * weights under the mount. Link with `pkg-config --libs artfs`. */
#ifndef ARTFS_CLIENT_H
#define ARTFS_CLIENT_H

#include <stddef.h>
#include <stdint.h>

#include "artfs/artfs.h"

#ifdef __cplusplus
extern "C" {
#endif

struct artfs_tensor {
	const char *name;
	const char *dtype;        /* safetensors name: "BF16", "F8_E4M3", ... */
	int ndim;
	int64_t shape[8];
	void *data;               /* device pointer into the attached slab */
	uint64_t size;            /* bytes */
};

struct artfs_weights;

/* What an engine on device `device` expects of the checkpoint in dir. */
int artfs_fingerprint(const char *checkpoint_dir, int tp_size, int tp_rank, int device,
		      struct artfs_fingerprint *fp, char *err, size_t errlen);

/* Opens <mount>/<wv>/weights/rank<rank>, attaches, maps every slab with
 * cudaIpcOpenMemHandle on the current device, reads manifest.json. The
 * open file stays open until artfs_weights_detach: it is the attachment. */
int artfs_weights_attach(const char *mount, const char *wv, int rank,
			 const struct artfs_fingerprint *expect, struct artfs_weights **out,
			 char *err, size_t errlen);
size_t artfs_weights_count(const struct artfs_weights *w);
const struct artfs_tensor *artfs_weights_tensor(const struct artfs_weights *w, size_t i);
const struct artfs_tensor *artfs_weights_find(const struct artfs_weights *w, const char *name);
/* The attachment's file, e.g. to poll() for POLLERR: the daemon died. */
int artfs_weights_fd(const struct artfs_weights *w);
void artfs_weights_detach(struct artfs_weights *w);

/* Flip in place (DESIGN.md section 4.3): attach with the slabs mapped one
 * after the other in [base, base + len), a range the engine reserved
 * (cuMemAddressReserve, 2 MiB aligned, as long as manifest.json's slab
 * sizes together), or in one reserved here when base is NULL (freed at
 * detach). Then artfs_weights_flip maps another version of the same layout
 * at the same addresses: every tensor keeps its data pointer, CUDA graphs
 * captured on them stay valid, and nothing is copied or allocated. */
int artfs_weights_attach_at(const char *mount, const char *wv, int rank,
			    const struct artfs_fingerprint *expect, void *base, size_t len,
			    struct artfs_weights **out, char *err, size_t errlen);
/* Switches an attachment in place to version wv (same rank): waits for the
 * device (cudaDeviceSynchronize: no kernel may run on the weights meanwhile,
 * so flip between steps), unmaps each slab and maps wv's there. On any
 * failure the version before stays mapped. On success its attachment ends
 * (unload then frees its memory). -EXDEV: wv's layout is another (other
 * tensor names, dtypes or shapes) or unknown: bind it anew instead;
 * -EINVAL: w was not attached in place; else the attach errnos. */
int artfs_weights_flip(struct artfs_weights *w, const char *wv,
		       const struct artfs_fingerprint *expect, char *err, size_t errlen);
/* The layout digest of the slabs in use (ARTFS_LAYOUT_SIZE bytes;
 * manifest.json's ranks[k].layout): equal digests flip in place. */
const uint8_t *artfs_weights_layout(const struct artfs_weights *w);

#ifdef __cplusplus
}
#endif

#endif
