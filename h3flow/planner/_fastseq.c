/* The local search's inner loop in C: timing sequences and late-acceptance hill climbing.
 *
 * The same model and the same moves as h3flow/planner/sequence.py (timeline, deliver) and
 * h3flow/planner/improve.py (_random_move, late_acceptance), without Python's per-step cost:
 * the search runs 10-40x more evaluations in the same time, and releases Python's lock while
 * it runs. Optional: without a C compiler the planner uses its Python code (same schedules
 * from the evaluator, the same kind of search, fewer evaluations per second).
 *
 * A sequence is a list per pool of items: a clip index j (its sampling, with its encode first
 * on a pool that encodes for itself) or ~j (the encode of clip j for a borrower, on the
 * borrower's encoder pool). Additions only, in the Python code's order: the times are equal
 * to the last bit (tests/test_planner_fastseq.py checks it).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define CUT_TOLERANCE 1e-6
#define EPS 1e-6

typedef struct {
    int n, pools, links, decoders, ahead;
    int *encoder, *own, *kind;            /* [pool], [pool], [clip] */
    int *route_d, *route_l;               /* [pool][decoder]: a pool's routes, one per decoder */
    double *prep, *work, *tail;           /* [clip][pool] */
    double *transfer;                     /* [clip][link] */
    double *decode;                       /* [clip][decoder] */
} Tables;

typedef struct {   /* one set of sequences: pool p's items are items[p * cap .. p * cap + len[p]) */
    int *items, *len;
} Seqs;

typedef struct {   /* scratch space for timing, sized once per table */
    int *pool_of, *rank, *ptr, *order, *order2, *has_enc, *has_hand, *link;
    double *enc_end, *handed, *freep, *link_free, *arrived, *projected, *dec_free, *finish;
    double makespan;
} Work;

static void tables_free(PyObject *capsule) {
    Tables *t = (Tables *)PyCapsule_GetPointer(capsule, "h3flow.fastseq.Tables");
    if (!t) return;
    free(t->encoder); free(t->own); free(t->kind); free(t->route_d); free(t->route_l);
    free(t->prep); free(t->work); free(t->tail); free(t->transfer); free(t->decode);
    free(t);
}

/* a flat Python list of count numbers into ints (when given) or doubles */
static int read_numbers(PyObject *seq, int *ints, double *doubles, Py_ssize_t count) {
    PyObject *fast = PySequence_Fast(seq, "expected a sequence");
    if (!fast) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != count) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "wrong length");
        return -1;
    }
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(fast, i);
        double v = ints ? (double)PyLong_AsLong(item) : PyFloat_AsDouble(item);
        if (v == -1.0 && PyErr_Occurred()) { Py_DECREF(fast); return -1; }
        if (ints) ints[i] = (int)v;
        else doubles[i] = v;
    }
    Py_DECREF(fast);
    return 0;
}

static int read_ints(PyObject *seq, int *out, Py_ssize_t count) { return read_numbers(seq, out, NULL, count); }
static int read_doubles(PyObject *seq, double *out, Py_ssize_t count) { return read_numbers(seq, NULL, out, count); }

/* tables(n, pools, links, decoders, ahead, encoder, own, kind, route_d, route_l, prep, work, tail, transfer,
 * decode): flat lists, row-major as the comments in Tables say. */
static PyObject *py_tables(PyObject *self, PyObject *args) {
    int n, pools, links, decoders, ahead;
    PyObject *encoder, *own, *kind, *route_d, *route_l, *prep, *work, *tail, *transfer, *decode;
    if (!PyArg_ParseTuple(args, "iiiiiOOOOOOOOOO", &n, &pools, &links, &decoders, &ahead, &encoder, &own, &kind,
                          &route_d, &route_l, &prep, &work, &tail, &transfer, &decode))
        return NULL;
    if (n < 1 || pools < 1 || links < 1 || decoders < 1 || ahead < 1) {
        PyErr_SetString(PyExc_ValueError, "empty tables");
        return NULL;
    }
    Tables *t = calloc(1, sizeof(Tables));
    if (!t) return PyErr_NoMemory();
    t->n = n; t->pools = pools; t->links = links; t->decoders = decoders; t->ahead = ahead;
    t->encoder = malloc(sizeof(int) * pools); t->own = malloc(sizeof(int) * pools);
    t->kind = malloc(sizeof(int) * n);
    t->route_d = malloc(sizeof(int) * pools * decoders); t->route_l = malloc(sizeof(int) * pools * decoders);
    t->prep = malloc(sizeof(double) * n * pools); t->work = malloc(sizeof(double) * n * pools);
    t->tail = malloc(sizeof(double) * n * pools); t->transfer = malloc(sizeof(double) * n * links);
    t->decode = malloc(sizeof(double) * n * decoders);
    PyObject *capsule = PyCapsule_New(t, "h3flow.fastseq.Tables", tables_free);
    if (!capsule) { free(t); return NULL; }
    if (!t->encoder || !t->own || !t->kind || !t->route_d || !t->route_l || !t->prep || !t->work || !t->tail ||
        !t->transfer || !t->decode) {
        Py_DECREF(capsule);
        return PyErr_NoMemory();
    }
    if (read_ints(encoder, t->encoder, pools) || read_ints(own, t->own, pools) || read_ints(kind, t->kind, n) ||
        read_ints(route_d, t->route_d, (Py_ssize_t)pools * decoders) ||
        read_ints(route_l, t->route_l, (Py_ssize_t)pools * decoders) ||
        read_doubles(prep, t->prep, (Py_ssize_t)n * pools) || read_doubles(work, t->work, (Py_ssize_t)n * pools) ||
        read_doubles(tail, t->tail, (Py_ssize_t)n * pools) ||
        read_doubles(transfer, t->transfer, (Py_ssize_t)n * links) ||
        read_doubles(decode, t->decode, (Py_ssize_t)n * decoders)) {
        Py_DECREF(capsule);
        return NULL;
    }
    return capsule;
}

/* ------------------------------------------------------------------ timing */

static int work_alloc(Work *w, const Tables *t) {
    int n = t->n, P = t->pools;
    memset(w, 0, sizeof(Work));
    w->pool_of = malloc(sizeof(int) * n); w->rank = malloc(sizeof(int) * n); w->ptr = malloc(sizeof(int) * P);
    w->order = malloc(sizeof(int) * n); w->order2 = malloc(sizeof(int) * n);
    w->has_enc = malloc(sizeof(int) * n); w->has_hand = malloc(sizeof(int) * n); w->link = malloc(sizeof(int) * n);
    w->enc_end = malloc(sizeof(double) * n); w->handed = malloc(sizeof(double) * n);
    w->freep = malloc(sizeof(double) * P); w->link_free = malloc(sizeof(double) * t->links);
    w->arrived = malloc(sizeof(double) * n); w->projected = malloc(sizeof(double) * t->decoders);
    w->dec_free = malloc(sizeof(double) * t->decoders); w->finish = malloc(sizeof(double) * P);
    return (w->pool_of && w->rank && w->ptr && w->order && w->order2 && w->has_enc && w->has_hand && w->link &&
            w->enc_end && w->handed && w->freep && w->link_free && w->arrived && w->projected && w->dec_free &&
            w->finish) ? 0 : -1;
}

static void work_free(Work *w) {
    free(w->pool_of); free(w->rank); free(w->ptr); free(w->order); free(w->order2); free(w->has_enc);
    free(w->has_hand); free(w->link); free(w->enc_end); free(w->handed); free(w->freep); free(w->link_free);
    free(w->arrived); free(w->projected); free(w->dec_free); free(w->finish);
}

/* insertion sort of idx by key (stable: equal keys keep their order) - lists are nearly sorted */
static void sort_by(int *idx, int count, const double *key) {
    for (int i = 1; i < count; i++) {
        int v = idx[i];
        double kv = key[v];
        int j = i - 1;
        while (j >= 0 && key[idx[j]] > kv) { idx[j + 1] = idx[j]; j--; }
        idx[j + 1] = v;
    }
}

/* sequence.timeline + sequence.deliver: 0 and w->makespan, w->finish; -1 when the sequences deadlock or a latent
 * is handed off too late to be delivered by cutoff. */
static int evaluate(const Tables *t, const Seqs *s, int cap, double cutoff, Work *w) {
    int n = t->n, P = t->pools;
    int left = 0;
    for (int p = 0; p < P; p++) {
        int k = 0;
        const int *seq = s->items + (size_t)p * cap;
        for (int i = 0; i < s->len[p]; i++) {
            int item = seq[i];
            if (item >= 0) { w->pool_of[item] = p; w->rank[item] = k++; }
        }
        left += s->len[p];
        w->ptr[p] = 0;
        w->freep[p] = 0.0;
    }
    for (int j = 0; j < n; j++) { w->has_enc[j] = 0; w->has_hand[j] = 0; }
    while (left) {
        int moved = 0;
        for (int p = 0; p < P; p++) {
            const int *seq = s->items + (size_t)p * cap;
            int i = w->ptr[p], size = s->len[p], own_p = t->own[p];
            double tt = w->freep[p];
            while (i < size) {
                int item = seq[i];
                if (item >= 0) {
                    size_t at = (size_t)item * P + p;
                    if (own_p) {
                        tt += t->prep[at] + t->work[at];
                    } else {
                        if (!w->has_enc[item]) break;
                        double e = w->enc_end[item];
                        tt = tt > e ? tt : e;
                        tt += t->work[at];
                    }
                    w->handed[item] = tt;
                    w->has_hand[item] = 1;
                    if (tt + t->tail[at] > cutoff + CUT_TOLERANCE) return -1;
                } else {
                    int j = ~item;
                    int b = w->pool_of[j], k = w->rank[j];
                    if (k >= t->ahead) {
                        int g = s->items[(size_t)b * cap + (k - t->ahead)];
                        if (!w->has_hand[g]) break;
                        if (w->handed[g] > tt) tt = w->handed[g];
                    }
                    tt += t->prep[(size_t)j * P + b];
                    w->enc_end[j] = tt;
                    w->has_enc[j] = 1;
                }
                i++;
            }
            if (i != w->ptr[p]) {
                moved += i - w->ptr[p];
                w->ptr[p] = i;
                w->freep[p] = tt;
            }
        }
        if (!moved) return -1;
        left -= moved;
    }
    /* deliver: links in handoff order, decoders in arrival order */
    for (int j = 0; j < n; j++) w->order[j] = j;
    sort_by(w->order, n, w->handed);
    for (int l = 0; l < t->links; l++) w->link_free[l] = 0.0;
    int D = t->decoders;
    if (D == 1) {
        for (int i = 0; i < n; i++) {
            int j = w->order[i];
            int lk = t->route_l[(size_t)w->pool_of[j] * D];
            double h = w->handed[j], fr = w->link_free[lk];
            double st = h > fr ? h : fr;
            w->link_free[lk] = w->arrived[j] = st + t->transfer[(size_t)j * t->links + lk];
            w->link[j] = 0;
        }
    } else {
        for (int d = 0; d < D; d++) w->projected[d] = 0.0;
        for (int i = 0; i < n; i++) {
            int j = w->order[i], p = w->pool_of[j];
            double h = w->handed[j];
            int found = 0, bd = 0, bl = 0;
            double bf = 0.0, ba = 0.0;
            for (int r = 0; r < D; r++) {
                int d = t->route_d[(size_t)p * D + r], lk = t->route_l[(size_t)p * D + r];
                double st = h > w->link_free[lk] ? h : w->link_free[lk];
                double a = st + t->transfer[(size_t)j * t->links + lk];
                double f = (a > w->projected[d] ? a : w->projected[d]) + t->decode[(size_t)j * D + d];
                if (!found || f < bf || (f == bf && a < ba)) { found = 1; bf = f; ba = a; bd = d; bl = lk; }
            }
            w->link_free[bl] = ba;
            w->projected[bd] = bf;
            w->arrived[j] = ba;
            w->link[j] = bd;
        }
    }
    memcpy(w->order2, w->order, sizeof(int) * n);
    sort_by(w->order2, n, w->arrived);
    for (int d = 0; d < D; d++) w->dec_free[d] = 0.0;
    for (int p = 0; p < P; p++) w->finish[p] = 0.0;
    for (int i = 0; i < n; i++) {
        int j = w->order2[i], d = w->link[j];
        double a = w->arrived[j], fr = w->dec_free[d];
        double st = a > fr ? a : fr;
        double end = w->dec_free[d] = st + t->decode[(size_t)j * D + d];
        int p = w->pool_of[j];
        if (end > w->finish[p]) w->finish[p] = end;
    }
    double ms = 0.0;
    for (int d = 0; d < D; d++) if (w->dec_free[d] > ms) ms = w->dec_free[d];
    w->makespan = ms;
    return 0;
}

/* ------------------------------------------------------------------ conversion */

static int seqs_alloc(Seqs *s, int pools, int cap) {
    s->items = malloc(sizeof(int) * (size_t)pools * cap);
    s->len = malloc(sizeof(int) * pools);
    return (s->items && s->len) ? 0 : -1;
}

static void seqs_free(Seqs *s) { free(s->items); free(s->len); }

static void seqs_copy(Seqs *dst, const Seqs *src, int pools, int cap) {
    memcpy(dst->len, src->len, sizeof(int) * pools);
    for (int p = 0; p < pools; p++)
        memcpy(dst->items + (size_t)p * cap, src->items + (size_t)p * cap, sizeof(int) * src->len[p]);
}

static int read_seqs(PyObject *obj, const Tables *t, Seqs *s, int cap) {
    PyObject *fast = PySequence_Fast(obj, "sequences: a list per pool");
    if (!fast) return -1;
    if (PySequence_Fast_GET_SIZE(fast) != t->pools) {
        Py_DECREF(fast);
        PyErr_SetString(PyExc_ValueError, "sequences: one list per pool");
        return -1;
    }
    int seen = 0;
    for (int p = 0; p < t->pools; p++) {
        PyObject *row = PySequence_Fast(PySequence_Fast_GET_ITEM(fast, p), "a pool's items");
        if (!row) { Py_DECREF(fast); return -1; }
        Py_ssize_t size = PySequence_Fast_GET_SIZE(row);
        if (size > cap - 1) { Py_DECREF(row); Py_DECREF(fast); PyErr_SetString(PyExc_ValueError, "too many items"); return -1; }
        for (Py_ssize_t i = 0; i < size; i++) {
            long v = PyLong_AsLong(PySequence_Fast_GET_ITEM(row, i));
            if (v == -1 && PyErr_Occurred()) { Py_DECREF(row); Py_DECREF(fast); return -1; }
            if (v >= t->n || v < -(long)t->n) { Py_DECREF(row); Py_DECREF(fast); PyErr_SetString(PyExc_ValueError, "item out of range"); return -1; }
            s->items[(size_t)p * cap + i] = (int)v;
            if (v >= 0) seen++;
        }
        s->len[p] = (int)size;
        Py_DECREF(row);
    }
    Py_DECREF(fast);
    if (seen != t->n) { PyErr_SetString(PyExc_ValueError, "every clip must be sampled once"); return -1; }
    return 0;
}

static PyObject *seqs_to_list(const Seqs *s, int pools, int cap) {
    PyObject *out = PyList_New(pools);
    if (!out) return NULL;
    for (int p = 0; p < pools; p++) {
        PyObject *row = PyList_New(s->len[p]);
        if (!row) { Py_DECREF(out); return NULL; }
        for (int i = 0; i < s->len[p]; i++) PyList_SET_ITEM(row, i, PyLong_FromLong(s->items[(size_t)p * cap + i]));
        PyList_SET_ITEM(out, p, row);
    }
    return out;
}

static PyObject *result(const Tables *t, const Work *w) {
    PyObject *finish = PyList_New(t->pools);
    if (!finish) return NULL;
    for (int p = 0; p < t->pools; p++) PyList_SET_ITEM(finish, p, PyFloat_FromDouble(w->finish[p]));
    return Py_BuildValue("(dN)", w->makespan, finish);
}

/* evaluate(tables, seqs, cutoff) -> (makespan, [finish per pool]) or None */
static PyObject *py_evaluate(PyObject *self, PyObject *args) {
    PyObject *capsule, *obj;
    double cutoff;
    if (!PyArg_ParseTuple(args, "OOd", &capsule, &obj, &cutoff)) return NULL;
    Tables *t = (Tables *)PyCapsule_GetPointer(capsule, "h3flow.fastseq.Tables");
    if (!t) return NULL;
    int cap = 2 * t->n + 1;
    Seqs s = {0};
    Work w;
    memset(&w, 0, sizeof(w));
    PyObject *out = NULL;
    if (seqs_alloc(&s, t->pools, cap) || work_alloc(&w, t)) { PyErr_NoMemory(); goto done; }
    if (read_seqs(obj, t, &s, cap)) goto done;
    if (evaluate(t, &s, cap, cutoff, &w)) { out = Py_None; Py_INCREF(out); }
    else out = result(t, &w);
done:
    seqs_free(&s);
    work_free(&w);
    return out;
}

/* ------------------------------------------------------------------ late acceptance */

static uint64_t next_random(uint64_t *state) {   /* splitmix64 */
    uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

static int below(uint64_t *state, int n) { return (int)(next_random(state) % (uint64_t)n); }
static double uniform(uint64_t *state) { return (next_random(state) >> 11) * (1.0 / 9007199254740992.0); }

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static double round6(double x) { return nearbyint(x * 1e6) / 1e6; }

/* the key the Python search compares: makespan, then the pools' finish times largest first (rounded to 1 us) */
static void key_of(const Work *w, int pools, double *key) {
    key[0] = round6(w->makespan);
    for (int p = 0; p < pools; p++) {
        double v = round6(w->finish[p]);
        int i = p;
        while (i > 0 && key[i] < v) { key[i + 1] = key[i]; i--; }   /* insertion, largest first */
        key[i + 1] = v;
    }
}

static int key_cmp(const double *a, const double *b, int size) {
    for (int i = 0; i < size; i++) {
        if (a[i] < b[i]) return -1;
        if (a[i] > b[i]) return 1;
    }
    return 0;
}

static int find(const int *seq, int len, int item) {
    for (int i = 0; i < len; i++) if (seq[i] == item) return i;
    return -1;
}

static void remove_at(int *seq, int *len, int i) {
    memmove(seq + i, seq + i + 1, sizeof(int) * (*len - i - 1));
    (*len)--;
}

static void insert_at(int *seq, int *len, int i, int item) {
    memmove(seq + i + 1, seq + i, sizeof(int) * (*len - i));
    seq[i] = item;
    (*len)++;
}

/* improve._random_move into cand (a copy of cur): 0, or -1 when the drawn move does not apply */
static int random_move(const Tables *t, const Seqs *cur, Seqs *cand, int cap, const double *finish,
                       const int *pool_of, uint64_t *rng, int *scratch) {
    int n = t->n, P = t->pools;
    double r = uniform(rng);
    seqs_copy(cand, cur, P, cap);
    if (r < 0.45) {
        int late = 0;
        for (int p = 1; p < P; p++) if (finish[p] > finish[late]) late = p;
        int count = 0;
        if (uniform(rng) < 0.5) {
            for (int j = 0; j < n; j++) if (pool_of[j] == late) scratch[count++] = j;
        }
        int j = count ? scratch[below(rng, count)] : below(rng, n);
        int p = pool_of[j];
        int *seq_p = cand->items + (size_t)p * cap;
        remove_at(seq_p, &cand->len[p], find(seq_p, cand->len[p], j));
        if (!t->own[p]) {
            int e = t->encoder[p];
            int *seq_e = cand->items + (size_t)e * cap;
            remove_at(seq_e, &cand->len[e], find(seq_e, cand->len[e], ~j));
        }
        int q = below(rng, P);
        int pos = below(rng, cand->len[q] + 1);
        int *seq_q = cand->items + (size_t)q * cap;
        insert_at(seq_q, &cand->len[q], pos, j);
        if (t->own[q]) return 0;
        int e = t->encoder[q];
        int *seq_e = cand->items + (size_t)e * cap;
        int lo = 0, hi = cand->len[e];
        for (int i = 0; i < cand->len[q]; i++) {
            if (i == pos) continue;
            int at = find(seq_e, cand->len[e], ~seq_q[i]);
            if (at < 0) continue;
            if (i < pos) { if (at + 1 > lo) lo = at + 1; }
            else if (at < hi) hi = at;
        }
        if (lo > hi) return -1;
        int slot;
        if (hi - lo + 1 > 3) {
            int c = below(rng, 3);
            slot = c == 0 ? lo : c == 1 ? hi : lo + 1 + below(rng, hi - lo - 1);
        } else {
            slot = lo + below(rng, hi - lo + 1);
        }
        insert_at(seq_e, &cand->len[e], slot, ~j);
        return 0;
    }
    if (r < 0.9 && n > 1) {
        int a = below(rng, n), b = below(rng, n - 1);
        if (b >= a) b++;
        if (t->kind[a] == t->kind[b] && pool_of[a] != pool_of[b]) return -1;
        for (int p = 0; p < P; p++) {
            int *seq = cand->items + (size_t)p * cap;
            for (int i = 0; i < cand->len[p]; i++) {
                int v = seq[i];
                if (v == a) seq[i] = b;
                else if (v == b) seq[i] = a;
                else if (v == ~a) seq[i] = ~b;
                else if (v == ~b) seq[i] = ~a;
            }
        }
        return 0;
    }
    int borrowers = 0;
    for (int p = 0; p < P; p++) if (!t->own[p]) scratch[borrowers++] = p;
    if (!borrowers) return -1;
    int e = t->encoder[scratch[below(rng, borrowers)]];
    int *seq_e = cand->items + (size_t)e * cap;
    int lent = 0;
    for (int i = 0; i < cand->len[e]; i++) if (seq_e[i] < 0) scratch[lent++] = i;
    if (!lent) return -1;
    int i = scratch[below(rng, lent)];
    int k = i + (below(rng, 2) ? 1 : -1);
    if (k < 0 || k >= cand->len[e]) return -1;
    int v = seq_e[i];
    seq_e[i] = seq_e[k];
    seq_e[k] = v;
    return 0;
}

static void pools_of(const Seqs *s, int pools, int cap, int *pool_of) {
    for (int p = 0; p < pools; p++)
        for (int i = 0; i < s->len[p]; i++) {
            int v = s->items[(size_t)p * cap + i];
            if (v >= 0) pool_of[v] = p;
        }
}

/* late_acceptance(tables, seqs, seconds, max_evals, seed, history) -> (best seqs, evaluations) */
static PyObject *py_late_acceptance(PyObject *self, PyObject *args) {
    PyObject *capsule, *obj;
    double seconds;
    long long max_evals;
    unsigned long long seed;
    int history;
    if (!PyArg_ParseTuple(args, "OOdLKi", &capsule, &obj, &seconds, &max_evals, &seed, &history)) return NULL;
    Tables *t = (Tables *)PyCapsule_GetPointer(capsule, "h3flow.fastseq.Tables");
    if (!t) return NULL;
    if (history < 1) { PyErr_SetString(PyExc_ValueError, "history must be positive"); return NULL; }
    int P = t->pools, n = t->n, cap = 2 * n + 1, ksize = P + 1;
    Seqs cur = {0}, cand = {0}, best = {0};
    Work w;
    memset(&w, 0, sizeof(w));
    double *past = malloc(sizeof(double) * history);
    double *cur_key = malloc(sizeof(double) * ksize), *cand_key = malloc(sizeof(double) * ksize);
    double *best_key = malloc(sizeof(double) * ksize), *finish = malloc(sizeof(double) * P);
    int *pool_of = malloc(sizeof(int) * n), *scratch = malloc(sizeof(int) * cap);
    PyObject *out = NULL;
    if (!past || !cur_key || !cand_key || !best_key || !finish || !pool_of || !scratch || seqs_alloc(&cur, P, cap) ||
        seqs_alloc(&cand, P, cap) || seqs_alloc(&best, P, cap) || work_alloc(&w, t)) {
        PyErr_NoMemory();
        goto done;
    }
    if (read_seqs(obj, t, &cur, cap)) goto done;
    if (evaluate(t, &cur, cap, INFINITY, &w)) {
        PyErr_SetString(PyExc_ValueError, "the starting sequences deadlock");
        goto done;
    }
    long long evals = 0;
    Py_BEGIN_ALLOW_THREADS
    uint64_t rng = seed * 0x2545f4914f6cdd1dULL + 1;
    double deadline = now_seconds() + seconds;
    key_of(&w, P, cur_key);
    memcpy(finish, w.finish, sizeof(double) * P);
    memcpy(best_key, cur_key, sizeof(double) * ksize);
    seqs_copy(&best, &cur, P, cap);
    for (int i = 0; i < history; i++) past[i] = cur_key[0];
    pools_of(&cur, P, cap, pool_of);
    for (long long step = 0; step < max_evals; step++) {
        if (step % 64 == 0 && now_seconds() >= deadline) break;
        if (random_move(t, &cur, &cand, cap, finish, pool_of, &rng, scratch)) continue;
        evals++;
        int slot = (int)(step % history);
        double cutoff = (past[slot] > cur_key[0] ? past[slot] : cur_key[0]) + EPS;
        if (!evaluate(t, &cand, cap, cutoff, &w)) {
            key_of(&w, P, cand_key);
            if (cand_key[0] <= past[slot] || key_cmp(cand_key, cur_key, ksize) <= 0) {
                Seqs swap = cur;
                cur = cand;
                cand = swap;
                memcpy(cur_key, cand_key, sizeof(double) * ksize);
                memcpy(finish, w.finish, sizeof(double) * P);
                pools_of(&cur, P, cap, pool_of);
                if (key_cmp(cur_key, best_key, ksize) < 0) {
                    memcpy(best_key, cur_key, sizeof(double) * ksize);
                    seqs_copy(&best, &cur, P, cap);
                }
            }
        }
        if (cur_key[0] < past[slot]) past[slot] = cur_key[0];
    }
    Py_END_ALLOW_THREADS
    PyObject *lists = seqs_to_list(&best, P, cap);
    if (lists) out = Py_BuildValue("(NL)", lists, evals);
done:
    seqs_free(&cur); seqs_free(&cand); seqs_free(&best);
    work_free(&w);
    free(past); free(cur_key); free(cand_key); free(best_key); free(finish); free(pool_of); free(scratch);
    return out;
}

static PyMethodDef methods[] = {
    {"tables", py_tables, METH_VARARGS, "An instance's durations as C arrays (a capsule)."},
    {"evaluate", py_evaluate, METH_VARARGS, "(makespan, finish per pool) of sequences, or None (deadlock / cut off)."},
    {"late_acceptance", py_late_acceptance, METH_VARARGS, "Late-acceptance hill climbing: (best sequences, evaluations)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_fastseq", "The local search's inner loop in C.", -1, methods};

PyMODINIT_FUNC PyInit__fastseq(void) { return PyModule_Create(&module); }
