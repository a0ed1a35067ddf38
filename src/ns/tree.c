#include "autoconf.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "format/key.h"
#include "lib/log.h"
#include "ns/control.h"
#include "ns/info.h"
#include "ns/listing.h"
#include "ns/revive.h"
#include "ns/tree.h"
#include "r3/fetch.h"
#include "r3/get.h"
#include "r3/keyfile.h"
#include "r3/materialize.h"
#include "r3/object.h"
#include "r3/publish.h"
#include "r3/put.h"
#include "r3/scan.h"
#include "remote/remote.h"
#include "state/ids.h"
#include "state/transaction.h"
#include "weights/weights.h"

#define DIR_ATTR_TIMEOUT 1.0  /* version mtimes move with activity */
/* The writer's own view of a file being published: the kernel tracks its
 * size on write; a lookup after commit brings the committed attributes. */
#define UPLOAD_ATTR_TIMEOUT 1.0

int tree_open(struct tree *t, struct artfs_config *cfg, char *err, size_t errlen)
{
	struct tree_start alone = { .held_fd = -1, .lock_fd = -1, .keeper_fd = -1 };

	return tree_open_start(t, cfg, &alone, err, errlen);
}

/* The memory the ids live in: the holder's, or this process's own. */
static int open_held(struct tree *t, const struct tree_start *start, char *err, size_t errlen)
{
	int rc = start->held_fd >= 0 ? held_map(start->held_fd, &t->held)
				     : held_map_private(&t->held);

	if (rc < 0)
		snprintf(err, errlen, "cannot map %s: %s",
			 start->held_fd >= 0 ? "the memory its holder keeps" : "its id tables",
			 strerror(-rc));
	else if (!start->takeover)
		t->held.fresh = true;
	return rc;
}

int tree_open_start(struct tree *t, struct artfs_config *cfg, const struct tree_start *start,
		    char *err, size_t errlen)
{
	memset(t, 0, sizeof(*t));
	t->held.fd = -1;
	t->cfg = cfg;
	t->started = clock_now();
	mutex_init_adaptive(&t->lock);
	for (int i = 0; i < COMMIT_STRIPES; i++)
		mutex_init_adaptive(&t->commit_locks[i]);
	pthread_mutex_init(&t->weights_mu, NULL);
	pthread_cond_init(&t->weights_cv, NULL);
	pthread_cond_init(&t->sized_cv, NULL);
	index_init(&t->idx);
	t->root.type = NODE_ROOT;
	t->info_dir.type = NODE_INFO_DIR;
	for (int i = 0; i < INFO_COUNT; i++) {
		t->info_files[i].type = NODE_INFO_FILE;
		t->info_files[i].sub = (uint8_t)i;
	}
	t->keys_dir.type = NODE_KEYS_DIR;
	t->keys_put.type = NODE_PUT;
	t->keys_get.type = NODE_GET;
	t->attach_node.type = NODE_SOCKET;
	grants_init(&t->grants);
	keeper_link_init(&t->keeper, start->keeper_fd);
	ids_init(t);
	ids_set_weights_describe(weights_describe_node);
	int rc = open_held(t, start, err, errlen);
	if (rc < 0)
		goto fail;
	rc = store_open(&t->store, cfg->store, start->lock_fd, err, errlen);
	if (rc < 0)
		goto fail;
	if (cfg->remote && *cfg->remote) {
		struct remote_config rc_cfg = {
			.seeds = cfg->remote, .prefix = cfg->remote_prefix, .ttl_s = cfg->remote_ttl,
			.timeout_ms = cfg->remote_timeout * 1000, .auth_file = cfg->remote_auth,
		};
		rc = remote_open(&rc_cfg, &t->remote);
		if (rc < 0) {
			snprintf(err, errlen, "remote=%s: %s (see the log)", cfg->remote,
				 rc == -ENOTSUP ? "this artfs was built without Redis support"
						: strerror(-rc));
			goto fail;
		}
	}
	if (!start->defer_scan) {
		rc = scan_store(t, start->takeover, err, errlen);
		if (rc < 0)
			goto fail;
	}
	t->scan_deferred = start->defer_scan;
	t->took_over = start->takeover;
	return 0;
fail:
	tree_close(t);
	return rc;
}

void tree_close(struct tree *t)
{
	scan_size_stop(t);
	handles_release_all(t);
	weights_shutdown(t);
	index_destroy(&t->idx);
	remote_close(t->remote);
	t->remote = NULL;
	if (t->store.path)
		store_close(&t->store);
	pthread_mutex_destroy(&t->lock);
	for (int i = 0; i < COMMIT_STRIPES; i++)
		pthread_mutex_destroy(&t->commit_locks[i]);
	pthread_mutex_destroy(&t->weights_mu);
	pthread_cond_destroy(&t->weights_cv);
	pthread_cond_destroy(&t->sized_cv);
	if (t->node_scan_started)
		pthread_join(t->node_scan, NULL);
	ids_close(t);
	held_unmap(&t->held);
	grants_destroy(&t->grants);
	keeper_link_destroy(&t->keeper);
}

static void *scan_nodes(void *arg)
{
	held_scan_nodes(&((struct tree *)arg)->held);
	return NULL;
}

int tree_take_over(struct tree *t)
{
	char err[256];

	if (t->scan_deferred) { /* what the daemon before committed is all in now */
		t->scan_deferred = false;
		int rc = scan_store(t, true, err, sizeof(err));
		if (rc < 0) {
			log_err("takeover: %s", err);
			return rc;
		}
	}
	held_take_over(&t->held);
	weights_take_over(t);
	t->node_scan_started = pthread_create(&t->node_scan, NULL, scan_nodes, t) == 0;
	if (!t->node_scan_started) /* without it, new ids come from above the mark only */
		log_warn("takeover: cannot scan the node ids in the background");
	return 0;
}

void tree_hand_over(struct tree *t)
{
	handles_hand_over(t);
	t->handing_over = true;
}

/* ---- attributes --------------------------------------------------------- */

static void stat_common(struct tree *t, struct node *n, struct stat *st, mode_t mode)
{
	memset(st, 0, sizeof(*st));
	st->st_ino = node_id(t, n);
	st->st_mode = (mode & S_IFMT) | (mode & 07777 & ~t->cfg->umask);
	st->st_nlink = S_ISDIR(mode) ? 2 : 1;
	st->st_uid = t->cfg->uid;
	st->st_gid = t->cfg->gid;
	st->st_blksize = 128 * 1024;
	st->st_atim.tv_sec = st->st_mtim.tv_sec = st->st_ctim.tv_sec = t->started;
}

void tree_object_stat(struct tree *t, struct object *o, struct stat *st)
{
	bool committed = o->state != OBJECT_PUBLISHING;
	uint64_t size = committed ? atomic_load(&o->npy_size) : atomic_load(&o->file_size);
	uint64_t ns = atomic_load(&o->ctime_ns);

	stat_common(t, &o->node, st, S_IFREG | (committed ? 0444 : 0644));
	st->st_size = (off_t)size;
	st->st_blocks = (blkcnt_t)((size + 511) / 512);
	if (committed) {
		st->st_mtim.tv_sec = st->st_ctim.tv_sec = st->st_atim.tv_sec = (time_t)(ns / 1000000000u);
		st->st_mtim.tv_nsec = st->st_ctim.tv_nsec = st->st_atim.tv_nsec = (long)(ns % 1000000000u);
	} else {
		st->st_mtim.tv_sec = st->st_ctim.tv_sec = st->st_atim.tv_sec = clock_now();
	}
}

static struct version *version_of_materialize(struct node *n)
{
	return (struct version *)((char *)n - offsetof(struct version, materialize));
}

static struct version *version_of_put(struct node *n)
{
	return (struct version *)((char *)n - offsetof(struct version, put));
}

static struct object *object_of_key(struct node *n)
{
	return (struct object *)((char *)n - offsetof(struct object, keynode));
}

/* A per-open transaction file that reads (.materialize, .get): any user
 * who may enter its directory may use it, whatever umask=. */
static void transaction_stat(struct tree *t, struct node *n, struct stat *st)
{
	stat_common(t, n, st, S_IFREG);
	st->st_mode = S_IFREG | 0666;
}

/* A batch publish (.put): writable by whoever may create objects in its
 * directory (0666 & ~umask=, as the directory's 0777 & ~umask=). */
static void put_stat(struct tree *t, struct node *n, struct stat *st)
{
	stat_common(t, n, st, S_IFREG | 0666);
}

static void version_stat(struct tree *t, struct version *v, struct stat *st)
{
	stat_common(t, &v->node, st, S_IFDIR | 0777);
	st->st_mtim.tv_sec = st->st_atim.tv_sec = atomic_load(&v->last_active);
	st->st_ctim.tv_sec = v->created;
}

/* A key's file is the envelope as published: its size is the store file's. */
static int key_getattr(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	struct object *o = object_of_key(n);
	uint64_t size = atomic_load(&o->file_size);

	if (o->state == OBJECT_COMMITTED) {
		int rc = object_envelope_size(t, o, &size);
		if (rc < 0)
			return rc;
	}
	tree_object_stat(t, o, st);
	st->st_ino = node_id(t, n);
	st->st_size = (off_t)size;
	st->st_blocks = (blkcnt_t)((size + 511) / 512);
	if (o->state == OBJECT_PUBLISHING)
		*timeout = UPLOAD_ATTR_TIMEOUT;
	return 0;
}

int tree_getattr(struct tree *t, struct node *n, struct stat *st, double *timeout)
{
	*timeout = CACHE_FOREVER;
	switch (n->type) {
	case NODE_ROOT:
		stat_common(t, n, st, S_IFDIR | 0777);
		*timeout = DIR_ATTR_TIMEOUT;
		return 0;
	case NODE_INFO_DIR:
		stat_common(t, n, st, S_IFDIR | 0555);
		return 0;
	case NODE_INFO_FILE:
		stat_common(t, n, st, S_IFREG | (n->sub == INFO_CONTROL ? 0200 : 0444));
		if (n->sub == INFO_CONTROL) { /* the mount's owner's, whatever uid=/gid= show */
			st->st_uid = getuid();
			st->st_gid = getgid();
		}
		*timeout = 0;
		return 0;
	case NODE_SOCKET:
		/* Any user may connect: what it gives needs a token. */
		stat_common(t, n, st, S_IFSOCK | 0666);
		st->st_mode = S_IFSOCK | 0666; /* whatever umask= says */
		*timeout = DIR_ATTR_TIMEOUT;
		return 0;
	case NODE_WEIGHTS_DIR:
	case NODE_WEIGHTS_FILE:
	case NODE_WEIGHTS_RANK:
		return weights_getattr(t, n, st, timeout);
	case NODE_VERSION: {
		struct version *v = (struct version *)n;
		if (v->removed)
			return -ENOENT;
		version_stat(t, v, st);
		*timeout = DIR_ATTR_TIMEOUT;
		return 0;
	}
	case NODE_MATERIALIZE:
		if (version_of_materialize(n)->removed)
			return -ENOENT;
		transaction_stat(t, n, st);
		return 0;
	case NODE_PUT:
		if (n != &t->keys_put && version_of_put(n)->removed)
			return -ENOENT;
		put_stat(t, n, st);
		return 0;
	case NODE_GET:
		transaction_stat(t, n, st);
		return 0;
	case NODE_KEYS_DIR:
		stat_common(t, n, st, S_IFDIR | 0777);
		*timeout = DIR_ATTR_TIMEOUT;
		return 0;
	case NODE_KEY:
		return key_getattr(t, n, st, timeout);
	case NODE_OBJECT: {
		struct object *o = (struct object *)n;
		if (o->state == OBJECT_COMMITTED) {
			int rc = object_know_size(t, o);
			if (rc < 0)
				return rc;
		}
		tree_object_stat(t, o, st);
		if (o->state == OBJECT_PUBLISHING)
			*timeout = UPLOAD_ATTR_TIMEOUT;
		return 0;
	}
	default:
		return -ENOENT;
	}
}

int tree_setattr(struct tree *t, struct node *n, unsigned to_set, const struct stat *in,
		 struct stat *out, double *timeout)
{
	bool command_file = n->type == NODE_MATERIALIZE || n->type == NODE_PUT ||
			    n->type == NODE_GET ||
			    (n->type == NODE_INFO_FILE && n->sub == INFO_CONTROL);
	if (command_file && to_set == TREE_SET_SIZE && in->st_size == 0)
		return tree_getattr(t, n, out, timeout); /* open(O_TRUNC): nothing to cut */
	if (n->type != NODE_OBJECT && n->type != NODE_KEY)
		return -EPERM;
	struct object *o = n->type == NODE_KEY ? object_of_key(n) : (struct object *)n;
	if (to_set & (TREE_SET_MODE | TREE_SET_UID | TREE_SET_GID))
		return -EPERM;
	if (to_set & TREE_SET_SIZE) {
		/* Objects are immutable. open(O_TRUNC) of a committed object (a
		 * re-publish) arrives here as a truncation to 0: accepted and
		 * ignored, so readers never see it shrink. */
		uint64_t now = o->state == OBJECT_PUBLISHING ? atomic_load(&o->file_size) : 0;
		if ((uint64_t)in->st_size != now)
			return -EPERM;
	}
	if ((to_set & (TREE_SET_ATIME | TREE_SET_MTIME)) && o->state != OBJECT_PUBLISHING)
		return -EPERM;
	return tree_getattr(t, n, out, timeout);
}

/* ---- names --------------------------------------------------------------- */

static int negative(struct tree_entry *e, double timeout)
{
	e->node = NULL;
	e->entry_timeout = timeout;
	return -ENOENT;
}

static int positive(struct tree *t, struct node *n, struct tree_entry *e)
{
	double timeout;
	uint64_t id = ids_node_ref(t, n);

	if (!id) {
		node_unref(n, 1);
		return -ENOMEM;
	}
	int rc = tree_getattr(t, n, &e->st, &timeout);
	if (rc < 0) {
		ids_node_forget(t, id, 1); /* the reference taken for the kernel goes too */
		return rc;
	}
	e->node = n;
	e->id = id;
	e->attr_timeout = timeout;
	bool publishing = (n->type == NODE_OBJECT &&
			   ((struct object *)n)->state == OBJECT_PUBLISHING) ||
			  (n->type == NODE_KEY && object_of_key(n)->state == OBJECT_PUBLISHING);
	e->entry_timeout = publishing ? 0 : CACHE_FOREVER;
	return 0;
}

static struct object *find_object(struct tree *t, struct version *v, const uint8_t *hash,
				  size_t len)
{
	return version_object_find(t, v, hash, len);
}

/* The object of a key, referenced through its key node. */
static struct object *find_key(struct tree *t, const uint8_t key[32])
{
	pthread_mutex_lock(&t->lock);
	struct object *o = index_key_find(&t->idx, key);
	if (o)
		node_ref(&o->keynode);
	pthread_mutex_unlock(&t->lock);
	return o;
}

static int lookup_in_root(struct tree *t, const char *name, struct tree_entry *e)
{
	if (strcmp(name, ARTFS_INFO_DIR) == 0) {
		node_ref(&t->info_dir);
		return positive(t, &t->info_dir, e);
	}
	if (strcmp(name, ARTFS_KEYS_DIR) == 0) {
		node_ref(&t->keys_dir);
		return positive(t, &t->keys_dir, e);
	}
	if (!key_version_name_valid(name))
		return negative(e, CACHE_FOREVER); /* can never exist */
	struct version *v = version_find(t, name);
	if (!v && t->remote) {
		/* With a cluster every version exists: a trainer opens
		 * <wv>/<hash> on a node that never saw <wv>. */
		int rc = version_make(t, name, &v);
		if (rc < 0 && rc != -EEXIST)
			return rc;
	}
	return v ? positive(t, &v->node, e) : negative(e, 0);
}

static int lookup_in_info_dir(struct tree *t, const char *name, struct tree_entry *e)
{
	for (int i = 0; i < INFO_COUNT; i++)
		if (strcmp(name, info_file_name((enum info_file)i)) == 0) {
			node_ref(&t->info_files[i]);
			return positive(t, &t->info_files[i], e);
		}
	if (strcmp(name, ARTFS_ATTACH_SOCKET) == 0) {
		if (!atomic_load(&t->attach_bound))
			return negative(e, 0); /* the daemon binds it once it serves */
		node_ref(&t->attach_node);
		return positive(t, &t->attach_node, e);
	}
	return negative(e, CACHE_FOREVER);
}

int tree_mknod(struct tree *t, struct node *parent, const char *name, mode_t mode, bool by_self,
	       struct tree_entry *e)
{
	memset(e, 0, sizeof(*e));
	if (parent->type != NODE_INFO_DIR || strcmp(name, ARTFS_ATTACH_SOCKET) != 0 ||
	    !S_ISSOCK(mode) || !by_self)
		return -EPERM;
	atomic_store(&t->attach_bound, true);
	node_ref(&t->attach_node);
	return positive(t, &t->attach_node, e);
}

/* <wv>/weights appears and goes through the control file, not through the
 * kernel: its absence is never cached. */
static int lookup_weights_dir(struct tree *t, struct version *v, struct tree_entry *e)
{
	pthread_mutex_lock(&t->lock);
	struct node *wd = v->weights ? weights_dir_node(v->weights) : NULL;
	if (wd)
		node_ref(wd);
	pthread_mutex_unlock(&t->lock);
	return wd ? positive(t, wd, e) : negative(e, 0);
}

/* The absence of an object is never cached: a batch (.put) names objects
 * behind the kernel's back, and an absence cached before it would hide the
 * object after the batch returned. */
static int lookup_object(struct tree *t, struct version *v, const char *name,
			 struct tree_entry *e)
{
	uint8_t hash[ARTFS_HASH_BYTES_MAX];
	size_t len;

	if (key_hash_decode(name, hash, &len) < 0)
		return negative(e, CACHE_FOREVER);
	struct object *o = find_object(t, v, hash, len);
	if (o)
		return positive(t, &o->node, e);
	if (!t->remote)
		return negative(e, 0);
	/* Not here: asked of the cluster, and never cached as absent. */
	struct fetch_item it = { .ver = v, .hash = hash, .hash_len = len };
	int rc = fetch_objects(t, &it, 1);
	if (rc == -ENOENT)
		return negative(e, 0);
	if (rc < 0)
		return rc;
	o = find_object(t, v, hash, len);
	return o ? positive(t, &o->node, e) : negative(e, 0);
}

static int lookup_in_version(struct tree *t, struct version *v, const char *name,
			     struct tree_entry *e)
{
	if (v->removed)
		return negative(e, 0);
	if (strcmp(name, ARTFS_MATERIALIZE_NAME) == 0) {
		node_ref(&v->materialize);
		return positive(t, &v->materialize, e);
	}
	if (strcmp(name, ARTFS_PUT_NAME) == 0) {
		node_ref(&v->put);
		return positive(t, &v->put, e);
	}
	if (strcmp(name, "weights") == 0)
		return lookup_weights_dir(t, v, e);
	return lookup_object(t, v, name, e);
}

/* A key's object may come from a publish under any name: its absence is
 * never cached. Keys of a restarted store are known once its objects are
 * counted. */
static int lookup_key(struct tree *t, const char *name, struct tree_entry *e)
{
	uint8_t key[32];
	if (strlen(name) != 64 || key_sha256_decode(name, key) < 0)
		return negative(e, CACHE_FOREVER);
	sizing_wait_for_key(t, key);
	struct object *o = find_key(t, key);
	if (!o && t->remote) {
		struct version *kv;
		int rc = version_keyonly(t, &kv);
		if (rc < 0)
			return rc;
		struct fetch_item it = { .ver = kv, .hash = key, .hash_len = 32 };
		rc = fetch_objects(t, &it, 1);
		node_unref(&kv->node, 1);
		if (rc < 0 && rc != -ENOENT)
			return rc;
		o = find_key(t, key);
	}
	return o ? positive(t, &o->keynode, e) : negative(e, 0);
}

static int lookup_in_keys_dir(struct tree *t, const char *name, struct tree_entry *e)
{
	if (strcmp(name, ARTFS_PUT_NAME) == 0) {
		node_ref(&t->keys_put);
		return positive(t, &t->keys_put, e);
	}
	if (strcmp(name, ARTFS_GET_NAME) == 0) {
		node_ref(&t->keys_get);
		return positive(t, &t->keys_get, e);
	}
	return lookup_key(t, name, e);
}

static int lookup_in_weights_dir(struct tree *t, struct node *parent, const char *name,
				 struct tree_entry *e)
{
	struct node *n;
	int rc = weights_lookup(t, parent, name, &n);
	if (rc < 0)
		return negative(e, 0);
	rc = positive(t, n, e);
	e->entry_timeout = 1.0; /* manifest.json appears when ready */
	return rc;
}

int tree_lookup(struct tree *t, struct node *parent, const char *name, struct tree_entry *e)
{
	memset(e, 0, sizeof(*e));
	switch (parent->type) {
	case NODE_ROOT:
		return lookup_in_root(t, name, e);
	case NODE_INFO_DIR:
		return lookup_in_info_dir(t, name, e);
	case NODE_VERSION:
		return lookup_in_version(t, (struct version *)parent, name, e);
	case NODE_KEYS_DIR:
		return lookup_in_keys_dir(t, name, e);
	case NODE_WEIGHTS_DIR:
		return lookup_in_weights_dir(t, parent, name, e);
	default:
		return -ENOTDIR;
	}
}

void tree_forget(struct tree *t, uint64_t id, uint64_t nlookup)
{
	ids_node_forget(t, id, nlookup);
}

struct node *tree_node(struct tree *t, uint64_t id)
{
	struct node *n = ids_node(t, id);

	if (n)
		return n;
	const struct held_node *r = ids_node_record(t, id);
	uint8_t type = r ? atomic_load(&r->type) : 0;
	if (type != NODE_WEIGHTS_DIR && type != NODE_WEIGHTS_FILE && type != NODE_WEIGHTS_RANK)
		return revive_node(t, id);
	/* weights a daemon before served, which the holder keeps */
	struct node *w = weights_revive_node(t, r);
	if (!w)
		return ids_node_install(t, id, &t->stale);
	struct node *mapped = ids_node_install(t, id, w);
	node_unref(w, 1);
	return mapped;
}

int tree_mkdir(struct tree *t, struct node *parent, const char *name, struct tree_entry *e)
{
	struct version *v;

	if (parent->type == NODE_VERSION && strcmp(name, "weights") == 0) {
		/* An empty weights/ for a GPU-direct publish (weights.c). */
		struct node *wd;
		int rc = ((struct version *)parent)->removed ? -ENOENT
			 : weights_mkdir(t, (struct version *)parent, &wd);
		return rc < 0 ? rc : positive(t, wd, e);
	}
	if (parent->type != NODE_ROOT)
		return -EPERM;
	int rc = version_make(t, name, &v);
	if (rc == -EEXIST)
		node_unref(&v->node, 1);
	if (rc < 0)
		return rc;
	return positive(t, &v->node, e); /* our creation reference becomes the kernel's */
}

int tree_rmdir(struct tree *t, struct node *parent, const char *name)
{
	if (parent->type != NODE_ROOT)
		return parent->type == NODE_VERSION ? -ENOENT : -EPERM;
	if (strcmp(name, ARTFS_INFO_DIR) == 0 || strcmp(name, ARTFS_KEYS_DIR) == 0)
		return -EPERM;
	int rc = 0;
	bool stray = false;
	struct version *listed = version_find(t, name);
	if (listed) { /* its objects counted first (a daemon that took over) */
		version_listed_wait(t, listed);
		node_unref(&listed->node, 1);
	}
	pthread_mutex_lock(&t->lock);
	struct version *v = index_version_find(&t->idx, name);
	if (!v)
		rc = -ENOENT;
	else if (v->objects.count || v->publishing)
		rc = -ENOTEMPTY;
	else if (v->weights)
		rc = -EBUSY; /* unload its weights first */
	else {
		rc = store_version_remove(&t->store, name);
		if (rc == 0)
			index_version_remove(&t->idx, v);
		stray = rc == -ENOTEMPTY;
	}
	pthread_mutex_unlock(&t->lock);
	if (stray)
		log_err("rmdir %s: its store directory holds files artfs did not index", name);
	if (rc == 0) {
		counter_inc(&t->metrics.versions_removed);
		log_info("rmdir %s: version removed", name);
	}
	return rc;
}

/* Removes a committed object under both its names (the administrator's
 * clean-up): found by its name in v, or (v NULL) by its key. */
static int remove_object(struct tree *t, struct version *v, const uint8_t *hash, size_t len,
			 const uint8_t *key)
{
	char name[ARTFS_HASH_HEX_MAX + 1];
	int rc = 0;
	uint64_t bytes = 0;
	uint8_t derived[32];

	if (v) { /* the key this name must carry chooses the commit lock */
		version_object_key_bin(v, hash, len, derived);
		key = derived;
		version_probe(t, v, hash, len);
	}
	pthread_mutex_t *commit_lock = commit_lock_of(t, key);
	pthread_mutex_lock(commit_lock);
	pthread_mutex_lock(&t->lock);
	struct object *o = v ? index_object_find(&t->idx, v, hash, len) : index_key_find(&t->idx, key);
	if (!o)
		rc = -ENOENT;
	else {
		struct stat st;
		v = o->ver;
		object_name(o, name);
		bytes = atomic_load(&o->file_size);
		if (bytes == OBJECT_SIZE_UNKNOWN) { /* found at start, not sized yet */
			bytes = store_object_stat(v->dirfd, v->keyonly, name, &st) == 0
					? (uint64_t)st.st_size : 0;
			sizing_counted_locked(t, v, bytes);
		}
		rc = store_object_remove(v->dirfd, v->keyonly, name);
		if (!atomic_load(&v->listed))
			v->unlisted_removals++;
		if (rc == 0 || rc == -ENOENT) {
			t->bytes_used -= bytes;
			t->objects--;
			v->bytes -= bytes;
			index_object_remove(&t->idx, v, o);
			rc = 0;
		}
	}
	pthread_mutex_unlock(&t->lock);
	pthread_mutex_unlock(commit_lock);
	if (rc == 0) {
		counter_inc(&t->metrics.unlinks);
		log_debug("unlink %s/%s: object removed (%llu bytes)", v->name, name,
			  (unsigned long long)bytes);
	} else if (rc != -ENOENT) {
		log_err("unlink %s/%s: %s", v->name, name, strerror(-rc));
		rc = -EIO;
	}
	return rc;
}

int tree_unlink(struct tree *t, struct node *parent, const char *name, bool by_self)
{
	uint8_t hash[ARTFS_HASH_BYTES_MAX];
	size_t len;

	if (parent->type == NODE_INFO_DIR) {
		if (strcmp(name, ARTFS_ATTACH_SOCKET) != 0 || !by_self)
			return -EPERM;
		atomic_store(&t->attach_bound, false); /* to be bound again */
		return 0;
	}

	if (parent->type == NODE_KEYS_DIR) {
		if (strlen(name) != 64 || key_sha256_decode(name, hash) < 0)
			return strcmp(name, ARTFS_PUT_NAME) && strcmp(name, ARTFS_GET_NAME) ? -ENOENT
											     : -EPERM;
		sizing_wait_for_key(t, hash);
		return remove_object(t, NULL, NULL, 0, hash);
	}
	if (parent->type != NODE_VERSION)
		return parent->type == NODE_ROOT ? -EISDIR : -EPERM;
	struct version *v = (struct version *)parent;
	if (strcmp(name, ARTFS_MATERIALIZE_NAME) == 0 || strcmp(name, ARTFS_PUT_NAME) == 0)
		return -EPERM;
	if (key_hash_decode(name, hash, &len) < 0)
		return -ENOENT;
	return remove_object(t, v, hash, len, NULL);
}

int tree_statfs(struct tree *t, struct statvfs *sv)
{
	const unsigned long bsize = 4096;

	memset(sv, 0, sizeof(*sv));
	pthread_mutex_lock(&t->lock);
	uint64_t used = t->bytes_used + t->bytes_reserved, objects = t->objects;
	pthread_mutex_unlock(&t->lock);
	uint64_t cap = t->cfg->capacity;
	sv->f_bsize = sv->f_frsize = bsize;
	sv->f_blocks = cap / bsize;
	sv->f_bfree = sv->f_bavail = used >= cap ? 0 : (cap - used) / bsize;
	sv->f_files = objects + sv->f_bfree;
	sv->f_ffree = sv->f_favail = sv->f_bfree;
	sv->f_namemax = ARTFS_HASH_HEX_MAX;
	return 0;
}

/* ---- files -------------------------------------------------------------- */

/* h (opened on n with flags) is whole: registered (shutdown releases it)
 * and numbered for the kernel. 0, or -ENFILE (no number: h released). */
static int handle_ready(struct tree *t, struct handle *h, struct node *n, int flags)
{
	handle_register(h);
	if (!ids_handle_bind(t, h, atomic_load(&n->id))) {
		handle_put(t, h);
		return -ENFILE;
	}
	struct held_handle *rec = ids_handle_record(t, h->fh);
	rec->flags = (uint16_t)(flags & O_ACCMODE);
	return 0;
}

/* A fresh object o (its creation reference becomes the kernel's on shown,
 * the node the create answers with) and its publish. */
static int begin_publish(struct tree *t, struct object *o, struct node *shown,
			 struct tree_entry *e, struct handle **h, struct open_reply *r)
{
	int rc = publish_begin(t, o, h);

	if (rc < 0) {
		node_unref(&o->node, 1);
		return rc;
	}
	r->direct_io = true; /* the bytes written are not the bytes read */
	rc = positive(t, shown, e);
	if (rc < 0) {
		publish_discard(*h);
		handle_put(t, *h);
		*h = NULL;
		return rc;
	}
	rc = handle_ready(t, *h, shown, O_WRONLY);
	if (rc < 0) {
		ids_node_forget(t, e->id, 1);
		*h = NULL;
	}
	return rc;
}

int tree_create(struct tree *t, struct node *parent, const char *name, int flags,
		struct tree_entry *e, struct handle **h, struct open_reply *r)
{
	uint8_t hash[ARTFS_HASH_BYTES_MAX];
	size_t len;

	memset(e, 0, sizeof(*e));
	struct version *v;
	struct object *o;
	if (parent->type == NODE_KEYS_DIR) {
		/* Publishing by key: the object has only its key until the same
		 * content is published by path. */
		if (strlen(name) != 64 || key_sha256_decode(name, hash) < 0) {
			log_warn("create .keys/%.200s: not a key (64 lowercase hex digits)", name);
			return -EINVAL;
		}
		len = 32;
		sizing_wait_for_key(t, hash);
		pthread_mutex_lock(&t->lock);
		bool held = index_key_find(&t->idx, hash) != NULL;
		pthread_mutex_unlock(&t->lock);
		if (held && (flags & O_EXCL))
			return -EEXIST;
		for (int attempt = 0;; attempt++) {
			int rc = version_keyonly(t, &v);
			if (rc < 0)
				return rc;
			o = object_new(v, hash, len);
			node_unref(&v->node, 1);
			if (!o)
				return -ENOMEM;
			rc = begin_publish(t, o, &o->keynode, e, h, r);
			/* ENOENT: the key-only version was collected meanwhile. */
			if (rc != -ENOENT || attempt == 2)
				return rc;
		}
	}
	if (parent->type != NODE_VERSION)
		return -EPERM; /* only R3 objects are files one can create */
	v = (struct version *)parent;
	if (key_hash_decode(name, hash, &len) < 0) {
		log_warn("create %s/%.200s: not a block hash name "
			 "(2 to 128 lowercase hex digits, even length)", v->name, name);
		return -EINVAL;
	}
	o = find_object(t, v, hash, len);
	if (o) {
		node_unref(&o->node, 1);
		if (flags & O_EXCL)
			return -EEXIST;
	}
	/* Always a fresh node, even when the key is committed (a create that
	 * raced a commit): the writer's inode is never the readers' one, so
	 * its writes cannot change the size the kernel has for readers. */
	o = object_new(v, hash, len);
	if (!o)
		return -ENOMEM;
	return begin_publish(t, o, &o->node, e, h, r);
}

static int open_node(struct tree *t, struct node *n, int flags, struct handle **h,
		     struct open_reply *r)
{
	bool writing = (flags & O_ACCMODE) != O_RDONLY;

	switch (n->type) {
	case NODE_INFO_FILE:
		if (n->sub == INFO_CONTROL)
			return (flags & O_ACCMODE) == O_WRONLY ? control_open(t, h, r) : -EACCES;
		if (writing)
			return -EACCES;
		return info_open(t, (enum info_file)n->sub, h, r);
	case NODE_WEIGHTS_FILE:
	case NODE_WEIGHTS_RANK:
		return weights_open(t, n, flags, h, r);
	case NODE_OBJECT: {
		struct object *o = (struct object *)n;
		if (o->state == OBJECT_REMOVED)
			return -ESTALE; /* unlinked since the lookup: the kernel looks again */
		if (o->state != OBJECT_COMMITTED)
			return -ENOENT;
		if (writing) {
			/* A committed object's inode is never written: the kernel would
			 * grow the size its readers see while the writes go on (they
			 * read zeros past the .npy). Its mode is 0444; root is refused
			 * too. An idempotent re-publish goes through .put. */
			char name[ARTFS_HASH_HEX_MAX + 1];
			object_name(o, name);
			log_debug("open %s/%s for writing: refused, published objects are read-only",
				  o->ver->name, name);
			return -EACCES;
		}
		return object_open(t, o, h, r);
	}
	case NODE_MATERIALIZE: {
		struct version *v = version_of_materialize(n);
		if (v->removed)
			return -ENOENT;
		return materialize_open(t, v, h, r);
	}
	case NODE_KEY: {
		struct object *o = object_of_key(n);
		if (o->state == OBJECT_REMOVED)
			return -ESTALE; /* removed, or moved to its name, since the lookup */
		if (o->state != OBJECT_COMMITTED)
			return -ENOENT;
		if (writing)
			return -EACCES; /* as for objects: publish again through .keys/.put */
		return keys_open(t, o, h, r);
	}
	case NODE_PUT: {
		struct version *v = n == &t->keys_put ? NULL : version_of_put(n);
		if (v && v->removed)
			return -ENOENT;
		return put_open(t, v, h, r);
	}
	case NODE_GET:
		return get_open(t, h, r);
	case NODE_KEYS_DIR:
		return -EISDIR;
	case NODE_ROOT:
	case NODE_INFO_DIR:
	case NODE_VERSION:
	case NODE_WEIGHTS_DIR:
		return -EISDIR;
	default:
		return -ENOENT;
	}
}

int tree_open_file(struct tree *t, struct node *n, int flags, struct handle **h,
		   struct open_reply *r)
{
	int rc = open_node(t, n, flags, h, r);

	return rc < 0 ? rc : handle_ready(t, *h, n, flags);
}

/* ---- handles a daemon before gave out --------------------------------------------- */

/* An fh that is no open file: every call fails (a kernel never sends one). */
static const struct handle_ops no_handle_ops = { .kind = "none", .release_slow = false };
static struct handle no_handle = { .ops = &no_handle_ops, .users = 1u << 30 };

/* A publish whose daemon died: opened again when nothing was written yet
 * (its first write is sent again), else what was decided, or EIO. */
static int reopen_publish(struct tree *t, struct node *n, const struct held_handle *rec,
			  struct handle **h)
{
	uint8_t state = atomic_load(&rec->state);

	if (state == REVIVE_FINISHED || state == REVIVE_COMMITTING) {
		int result = state == REVIVE_FINISHED ? rec->result : revive_commit_outcome(t, rec);
		*h = revive_finished(t, result);
		return *h ? 0 : -ENOMEM;
	}
	bool goes_on = (state == REVIVE_FRESH || state == REVIVE_HANDED) &&
		       (n->type == NODE_OBJECT || n->type == NODE_KEY);
	struct object *o = n->type == NODE_KEY ? object_of_key(n) : (struct object *)n;
	if (!goes_on || o->state != OBJECT_PUBLISHING) {
		*h = revive_dead(t, HANDLE_PUBLISH);
		return *h ? 0 : -ENOMEM;
	}
	node_ref(&o->node);
	if (state == REVIVE_FRESH) {
		int rc = publish_begin(t, o, h);
		if (rc < 0)
			node_unref(&o->node, 1);
		return rc;
	}
	return publish_resume(t, o, held_text(&t->held, rec), rec->text_len, h);
}

/* Opens fh's file again from its record, as its kind allows. */
static int reopen(struct tree *t, const struct held_handle *rec, struct handle **h)
{
	struct open_reply r = { 0 };
	struct node *n = tree_node(t, rec->node);
	enum handle_kind kind = (enum handle_kind)atomic_load(&rec->kind);
	uint8_t state = atomic_load(&rec->state);

	switch (kind) {
	case HANDLE_LISTING:
		return listing_open(t, n, h);
	case HANDLE_PUBLISH:
		return reopen_publish(t, n, rec, h);
	case HANDLE_PUT:
		if (n->type != NODE_PUT)
			break; /* its version is gone */
		if (state == REVIVE_HANDED)
			return put_resume(t, n == &t->keys_put ? NULL : version_of_put(n),
					  held_text(&t->held, rec), rec->text_len, h);
		if (state != REVIVE_FRESH)
			break; /* its batch died with the daemon */
		return open_node(t, n, rec->flags, h, &r);
	case HANDLE_RANK: /* an attachment of weights the holder keeps */
		if (n->type != NODE_WEIGHTS_RANK)
			break;
		return open_node(t, n, rec->flags, h, &r);
	case HANDLE_WEIGHTS_PUBLISH:
		break; /* a publish that died with the daemon */
	default:
		return open_node(t, n, rec->flags, h, &r);
	}
	*h = revive_dead(t, kind);
	return *h ? 0 : -ENOMEM;
}

struct handle *tree_released(struct tree *t, uint64_t fh)
{
	struct handle *h = ids_handle(t, fh);
	struct held_handle *rec;

	if (h)
		return h;
	rec = ids_handle_record(t, fh);
	if (rec && atomic_load(&rec->kind) != HANDLE_PUT && atomic_load(&rec->kind) != HANDLE_PUBLISH)
		held_handle_free(&t->held, fh); /* nothing of it is open here */
	else if (rec)
		return tree_handle(t, fh); /* a batch or publish handed over: its release ends it */
	return NULL;
}

struct handle *tree_handle(struct tree *t, uint64_t fh)
{
	struct handle *h = ids_handle(t, fh);
	const struct held_handle *rec;

	if (h)
		return h;
	if (!(rec = ids_handle_record(t, fh)))
		return &no_handle;
	int rc = reopen(t, rec, &h);
	if (rc < 0 && !(h = revive_dead(t, (enum handle_kind)atomic_load(&rec->kind)))) {
		log_err("takeover: cannot open file handle %llu again: %s", (unsigned long long)fh,
			strerror(-rc));
		return &no_handle;
	}
	if (rc < 0)
		log_warn("takeover: file handle %llu (kind %u) cannot be opened again (%s); its "
			 "calls fail with EIO", (unsigned long long)fh,
			 (unsigned)atomic_load(&rec->kind), strerror(-rc));
	handle_register(h);
	struct handle *mapped = ids_handle_install(t, fh, h);
	if (mapped != h) { /* another thread opened it first */
		h->fh = 0;
		handle_put(t, h);
		return mapped ? mapped : &no_handle;
	}
	if (h->ops->resume) /* a remnant that stands for a dead one has none */
		h->ops->resume(t, h);
	return h;
}

int tree_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
	      const void **data, size_t *len)
{
	if (!h->ops->read)
		return -EBADF;
	int rc = h->ops->read(t, h, off, size, data, len);
	if (rc == 0)
		handle_get(h); /* until the reply is sent: tree_read_done */
	return rc;
}

void tree_read_done(struct tree *t, struct handle *h)
{
	handle_put(t, h);
}

int tree_write(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
	       uint64_t owner)
{
	return h->ops->write ? h->ops->write(t, h, off, buf, len, owner) : -EBADF;
}

int tree_write_begin(struct tree *t, struct handle *h, uint64_t off, const void *buf, size_t len,
		     uint64_t owner)
{
	handle_get(h); /* until tree_write_end: a release after the reply waits for it */
	if (!h->ops->write_begin)
		return tree_write(t, h, off, buf, len, owner);
	return h->ops->write_begin(t, h, off, buf, len, owner);
}

void tree_write_end(struct tree *t, struct handle *h)
{
	if (h->ops->write_begin)
		h->ops->write_end(t, h);
	handle_put(t, h);
}

int tree_flush(struct tree *t, struct handle *h, uint64_t owner)
{
	return h->ops->flush ? h->ops->flush(t, h, owner) : 0;
}

int tree_fsync(struct tree *t, struct handle *h)
{
	return h->ops->fsync ? h->ops->fsync(t, h) : 0;
}

void tree_release(struct tree *t, struct handle *h)
{
	handle_put(t, h);
}

bool tree_read_quick(struct tree *t, struct handle *h)
{
	return !h->ops->read_quick || h->ops->read_quick(t, h);
}

bool tree_write_quick(struct tree *t, struct handle *h, size_t len)
{
	return !h->ops->write_quick || h->ops->write_quick(t, h, len);
}

bool tree_flush_quick(struct tree *t, struct handle *h)
{
	return !h->ops->flush_quick || h->ops->flush_quick(t, h);
}

bool tree_release_quick(struct tree *t, struct handle *h)
{
	return !h->ops->release_slow;
}

bool tree_name_quick(struct tree *t, struct node *parent)
{
	return !t->remote && !(parent == &t->keys_dir && t->sizing);
}

bool tree_opendir_quick(struct tree *t, struct node *n)
{
	if (n->type == NODE_KEYS_DIR)
		return !t->sizing && t->idx.keys.count < 4096;
	return n->type != NODE_VERSION || ((struct version *)n)->objects.count < 4096;
}

unsigned tree_poll(struct tree *t, struct handle *h)
{
	return h->ops->poll ? h->ops->poll(t, h) : POLLIN | POLLOUT | POLLRDNORM | POLLWRNORM;
}

int tree_ioctl(struct tree *t, struct handle *h, unsigned int cmd, const void *in, size_t in_len,
	       void *out, size_t out_len)
{
	return h->ops->ioctl ? h->ops->ioctl(t, h, cmd, in, in_len, out, out_len) : -ENOTTY;
}

/* ---- directories -------------------------------------------------------- */

int tree_opendir(struct tree *t, struct node *n, struct handle **h)
{
	int rc = listing_open(t, n, h);

	return rc < 0 ? rc : handle_ready(t, *h, n, O_RDONLY);
}

int tree_readdir(struct tree *t, struct handle *h, size_t i, struct dir_entry *de)
{
	return h->ops->readdir ? h->ops->readdir(t, h, i, de) : -ENOTDIR;
}

void tree_releasedir(struct tree *t, struct handle *h)
{
	handle_put(t, h);
}

/* ---- extended attributes ------------------------------------------------- */

int tree_getxattr(struct tree *t, struct node *n, const char *name, char *buf, size_t cap,
		  size_t *len)
{
	if (n->type == NODE_KEY)
		n = &object_of_key(n)->node;
	if (n->type != NODE_OBJECT || ((struct object *)n)->state != OBJECT_COMMITTED)
		return -ENODATA;
	return object_getxattr(t, (struct object *)n, name, buf, cap, len);
}

int tree_listxattr(struct tree *t, struct node *n, char *buf, size_t cap, size_t *len)
{
	(void)t;
	if (n->type == NODE_KEY)
		n = &object_of_key(n)->node;
	if (n->type != NODE_OBJECT || ((struct object *)n)->state != OBJECT_COMMITTED) {
		*len = 0;
		return 0;
	}
	return object_listxattr(buf, cap, len);
}
