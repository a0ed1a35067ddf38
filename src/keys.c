#include "autoconf.h"

#include <errno.h>
#include <stdlib.h>

#include "keys.h"
#include "object.h"

struct key_reader {
	struct handle h;
	pthread_mutex_t mu;
	struct object *obj;      /* referenced */
	bool loaded;
	int error;
	uint8_t *buf;            /* the envelope, verified */
	size_t len;
};

static void load(struct tree *t, struct key_reader *kr)
{
	struct object *o = kr->obj;
	uint64_t size;

	kr->loaded = true;
	kr->error = object_envelope_size(t, o, &size);
	if (kr->error)
		return;
	kr->buf = malloc(size ? size : 1);
	if (!kr->buf) {
		kr->error = -ENOMEM;
		return;
	}
	kr->len = (size_t)size;
	kr->error = object_load_envelope(t, o, kr->buf, kr->len);
}

static int key_read(struct tree *t, struct handle *h, uint64_t off, size_t size,
		    const void **data, size_t *len)
{
	struct key_reader *kr = (struct key_reader *)h;

	pthread_mutex_lock(&kr->mu);
	if (!kr->loaded)
		load(t, kr);
	pthread_mutex_unlock(&kr->mu);
	if (kr->error)
		return kr->error;
	buffer_slice(kr->buf, kr->len, off, size, data, len);
	return 0;
}

static bool key_read_quick(struct tree *t, struct handle *h)
{
	struct key_reader *kr = (struct key_reader *)h;

	(void)t;
	return kr->loaded || atomic_load(&kr->obj->file_size) <= HANDLE_QUICK_BYTES;
}

static void key_release(struct tree *t, struct handle *h)
{
	struct key_reader *kr = (struct key_reader *)h;
	struct version *v = kr->obj->ver;

	pthread_mutex_lock(&t->lock);
	v->open_files--;
	pthread_mutex_unlock(&t->lock);
	version_touch(v);
	node_unref(&kr->obj->node, 1);
	pthread_mutex_destroy(&kr->mu);
	free(kr->buf);
	free(kr);
}

static const struct handle_ops key_reader_ops = {
	.kind = "key",
	.read = key_read,
	.release = key_release,
	.read_quick = key_read_quick,
};

int keys_open(struct tree *t, struct object *o, struct handle **h, struct open_reply *r)
{
	struct key_reader *kr = calloc(1, sizeof(*kr));

	if (!kr)
		return -ENOMEM;
	handle_init(&kr->h, &key_reader_ops);
	pthread_mutex_init(&kr->mu, NULL);
	kr->obj = o;
	node_ref(&o->node);
	pthread_mutex_lock(&t->lock);
	o->ver->open_files++;
	pthread_mutex_unlock(&t->lock);
	counter_inc(&t->metrics.reads);
	version_touch(o->ver);
	/* Verified at every open: the pages of one open are not another's. */
	r->noflush = true;
	*h = &kr->h;
	return 0;
}
