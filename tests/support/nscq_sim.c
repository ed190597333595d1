/* A simulated NSCQ library (libnvidia-nscq) for tests: the calls gpucc's binding makes, with
 * the same C signatures, answering from files. GPUCC_TEST_NSCQ_DIR holds, for switch i
 * (0..N-1), report-i.bin and chain-i.pem, and nonce.bin: the nonce the reports answer. A
 * report is given only after nscq_session_set_input was called with that nonce; otherwise
 * the callback gets rc -5 (unexpected value). GPUCC_TEST_NSCQ_ARCH overrides the arch. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int8_t nscq_rc_t;
typedef struct { uint8_t bytes[16]; } nscq_uuid_t;
typedef struct { char data[64]; } nscq_label_t;
typedef struct { uint32_t report_size; uint8_t report[0x2000]; } nscq_attestation_report_t;
typedef struct { uint8_t cert_chain[0x1400]; uint32_t cert_chain_size; } nscq_attestation_certificate_t;
typedef struct { nscq_rc_t rc; void *session; } nscq_session_result_t;

typedef void (*uuid_cb)(const nscq_uuid_t *, nscq_rc_t, const nscq_uuid_t *, void *);
typedef void (*arch_cb)(const nscq_uuid_t *, nscq_rc_t, int8_t, void *);
typedef void (*report_cb)(const nscq_uuid_t *, nscq_rc_t, nscq_attestation_report_t, void *);
typedef void (*cert_cb)(const nscq_uuid_t *, nscq_rc_t, nscq_attestation_certificate_t, void *);

struct session { uint8_t nonce[32]; int has_nonce; };

static const char *dir(void) { const char *d = getenv("GPUCC_TEST_NSCQ_DIR"); return d ? d : "."; }

static long read_file(const char *name, int index, uint8_t *out, long cap) {
    char path[4096];
    if (index >= 0) snprintf(path, sizeof path, "%s/%s-%d.%s", dir(), name, index,
                             strcmp(name, "report") == 0 ? "bin" : "pem");
    else snprintf(path, sizeof path, "%s/%s", dir(), name);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    long n = (long)fread(out, 1, (size_t)cap, f);
    fclose(f);
    return n;
}

static int switches(void) {
    uint8_t probe[16];
    int n = 0;
    while (n < 64 && read_file("report", n, probe, sizeof probe) >= 0) n++;
    return n;
}

static nscq_uuid_t uuid_of(int i) { nscq_uuid_t u; memset(&u, 0, sizeof u); u.bytes[0] = (uint8_t)(i + 1); return u; }

nscq_session_result_t nscq_session_create(uint32_t flags) {
    nscq_session_result_t r;
    (void)flags;
    r.session = calloc(1, sizeof(struct session));
    r.rc = r.session ? 0 : -128;
    return r;
}

void nscq_session_destroy(void *session) { free(session); }

nscq_rc_t nscq_uuid_to_label(const nscq_uuid_t *uuid, nscq_label_t *label, uint32_t flags) {
    (void)flags;
    if (!uuid || uuid->bytes[0] == 0) return -2;
    snprintf(label->data, sizeof label->data, "sim-switch-%d", uuid->bytes[0] - 1);
    return 0;
}

nscq_rc_t nscq_session_set_input(void *session, uint32_t flags, void *data, uint32_t size) {
    struct session *s = session;
    (void)flags;
    if (size != 32) return -5;
    memcpy(s->nonce, data, 32);
    s->has_nonce = 1;
    return 0;
}

/* Which switches a path names: "/{nvswitch}/..." all of them, "/sim-switch-<i>/..." one. */
static int target(const char *path, const char **rest) {
    if (strncmp(path, "/{nvswitch}", 11) == 0) { *rest = path + 11; return -1; }
    if (strncmp(path, "/sim-switch-", 12) != 0) return -2;
    char *end;
    long i = strtol(path + 12, &end, 10);
    *rest = end;
    return (int)i;
}

nscq_rc_t nscq_session_path_observe(void *session, const char *path, void (*fn)(void),
                                    void *user_data, uint32_t flags) {
    struct session *s = session;
    int n = switches();
    (void)flags;
    if (strcmp(path, "/drv/nvswitch/{device}/uuid") == 0) {
        for (int i = 0; i < n; i++) { nscq_uuid_t u = uuid_of(i); ((uuid_cb)fn)(&u, 0, &u, user_data); }
        return 0;
    }
    const char *rest;
    int one = target(path, &rest);
    if (one == -2 || one >= n) return -2;
    for (int i = (one < 0 ? 0 : one); i < (one < 0 ? n : one + 1); i++) {
        nscq_uuid_t u = uuid_of(i);
        if (strcmp(rest, "/id/arch") == 0) {
            const char *arch = getenv("GPUCC_TEST_NSCQ_ARCH");
            ((arch_cb)fn)(&u, 0, (int8_t)(arch ? atoi(arch) : 2), user_data);
        } else if (strcmp(rest, "/config/attestation_report") == 0) {
            static nscq_attestation_report_t report;
            uint8_t expected[32];
            memset(&report, 0, sizeof report);
            nscq_rc_t rc = 0;
            if (!s->has_nonce || read_file("nonce.bin", -1, expected, 32) != 32 ||
                memcmp(expected, s->nonce, 32) != 0) rc = -5;
            long got = rc ? 0 : read_file("report", i, report.report, sizeof report.report);
            if (got < 0) rc = -7;
            report.report_size = got > 0 ? (uint32_t)got : 0;
            ((report_cb)fn)(&u, rc, report, user_data);
        } else if (strcmp(rest, "/config/certificate") == 0) {
            static nscq_attestation_certificate_t cert;
            memset(&cert, 0, sizeof cert);
            long got = read_file("chain", i, cert.cert_chain, sizeof cert.cert_chain);
            cert.cert_chain_size = got > 0 ? (uint32_t)got : 0;
            ((cert_cb)fn)(&u, got < 0 ? -7 : 0, cert, user_data);
        } else {
            return -1;
        }
    }
    return 0;
}
