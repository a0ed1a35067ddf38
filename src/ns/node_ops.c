/* SPDX-License-Identifier: Apache-2.0 */
/* The table of node kinds: for each type of node (enum node_type), the
 * functions of the namespace that answer for it (node_ops.h). A new kind
 * of node is a row here. */
#include "autoconf.h"

#include "ns/node_ops.h"
#include "trees/wtree.h"
#include "weights/weights.h"

/* The fixed nodes (the root, .artfs and its files, .keys, .keys/.put and
 * .get) are never revived: each daemon makes them, with the same ids, at
 * its start; their kinds have no revive. */
static const struct node_ops kinds[] = {
	[NODE_ROOT] = {
		.getattr = attr_root,
		.lookup = lookup_in_root,
		.list = listing_root,
	},
	[NODE_INFO_DIR] = { /* .artfs */
		.getattr = attr_info_dir,
		.lookup = lookup_in_info_dir,
		.list = listing_info_dir,
	},
	[NODE_INFO_FILE] = { /* .artfs/metrics, config, control */
		.getattr = attr_info_file,
		.open = files_open_info,
	},
	[NODE_SOCKET] = { /* .artfs/attach: connected to, never opened */
		.getattr = attr_socket,
	},
	[NODE_VERSION] = { /* <wv> */
		.getattr = attr_version,
		.lookup = lookup_in_version,
		.list = listing_version,
		.revive = revive_version,
	},
	[NODE_OBJECT] = { /* <wv>/<hash> */
		.getattr = attr_object,
		.open = files_open_object,
		.revive = revive_object,
	},
	[NODE_PUT] = { /* <wv>/.put, .keys/.put */
		.getattr = attr_put,
		.open = files_open_put,
		.revive = revive_put,
	},
	[NODE_MATERIALIZE] = { /* <wv>/.materialize */
		.getattr = attr_materialize,
		.open = files_open_materialize,
		.revive = revive_materialize,
	},
	[NODE_KEYS_DIR] = { /* .keys */
		.getattr = attr_keys_dir,
		.lookup = lookup_in_keys_dir,
		.list = listing_keys_dir,
	},
	[NODE_KEY] = { /* .keys/<key> */
		.getattr = attr_key,
		.open = files_open_key,
		.revive = revive_object,
	},
	[NODE_GET] = { /* .keys/.get */
		.getattr = attr_get,
		.open = files_open_get,
	},
	/* NODE_WEIGHTS: the owner of the three below, never seen by the kernel. */
	[NODE_WEIGHTS_DIR] = { /* <wv>/weights */
		.getattr = weights_getattr,
		.lookup = lookup_in_weights_dir,
		.list = listing_weights_dir,
		.revive = weights_revive_node,
	},
	[NODE_WEIGHTS_FILE] = { /* <wv>/weights/manifest.json, status, .publish */
		.getattr = weights_getattr,
		.open = weights_open,
		.revive = weights_revive_node,
	},
	[NODE_WEIGHTS_RANK] = { /* <wv>/weights/rank<k> */
		.getattr = weights_getattr,
		.open = weights_open,
		.revive = weights_revive_node,
	},
	[NODE_STALE] = { /* an id a daemon before this one gave, whose node is gone */
		.open = files_open_stale,
		.lookup = lookup_in_stale,
		.list = listing_stale,
	},
	[NODE_CACHE_DIR] = { /* .cache and the directories under it (src/trees/) */
		.getattr = attr_cache,
		.lookup = lookup_in_cache_dir,
		.list = listing_cache_dir,
		.revive = wtree_revive,
	},
	[NODE_BLOCKS_PUT] = { /* .blocks/.put */
		.getattr = attr_blocks_batch,
		.open = files_open_blocks_batch,
	},
	[NODE_BLOCKS_GET] = { /* .blocks/.get */
		.getattr = attr_blocks_batch,
		.open = files_open_blocks_batch,
	},
	[NODE_CACHE_FILE] = { /* a file under .cache or .blocks */
		.getattr = attr_cache,
		.open = files_open_cache,
		.revive = wtree_revive,
	},
};

const struct node_ops *node_ops_of(unsigned type)
{
	static const struct node_ops none;

	return type < sizeof(kinds) / sizeof(kinds[0]) ? &kinds[type] : &none;
}
