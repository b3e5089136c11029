/* A stand-in for Debian's libb64.so.0d (libb64 1.2's ABI), which the perf_analyzer binary of tritonclient links.
 * Built by scripts/setup-load-tools.sh only when the Debian package cannot be had. Written for trtspec; it keeps
 * libb64's observable behaviour: the encoder breaks lines every 72 characters and ends with a newline, the decoder
 * skips every character outside the alphabet (newlines, '=' padding) and may be fed in pieces. */

typedef enum { step_A, step_B, step_C } base64_encodestep;
typedef struct { base64_encodestep step; char result; int stepcount; } base64_encodestate;
typedef enum { step_a, step_b, step_c, step_d } base64_decodestep;
typedef struct { base64_decodestep step; char plainchar; } base64_decodestate;

static const char alphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
enum { GROUPS_PER_LINE = 72 / 4 };

char base64_encode_value(char value) { return (unsigned char)value > 63 ? '=' : alphabet[(unsigned char)value]; }

void base64_init_encodestate(base64_encodestate *s) { s->step = step_A; s->result = 0; s->stepcount = 0; }

int base64_encode_block(const char *in, int length, char *out, base64_encodestate *s) {
    const unsigned char *p = (const unsigned char *)in, *end = p + length;
    char *o = out;
    unsigned char carry = (unsigned char)s->result;
    while (p < end) {
        unsigned char c = *p++;
        switch (s->step) {
        case step_A:
            *o++ = alphabet[c >> 2];
            carry = (unsigned char)((c & 0x03) << 4);
            s->step = step_B;
            break;
        case step_B:
            *o++ = alphabet[carry | (c >> 4)];
            carry = (unsigned char)((c & 0x0f) << 2);
            s->step = step_C;
            break;
        case step_C:
            *o++ = alphabet[carry | (c >> 6)];
            *o++ = alphabet[c & 0x3f];
            s->step = step_A;
            if (++s->stepcount == GROUPS_PER_LINE) { *o++ = '\n'; s->stepcount = 0; }
            break;
        }
    }
    s->result = (char)carry;
    return (int)(o - out);
}

int base64_encode_blockend(char *out, base64_encodestate *s) {
    char *o = out;
    switch (s->step) {
    case step_B: *o++ = alphabet[(unsigned char)s->result]; *o++ = '='; *o++ = '='; break;
    case step_C: *o++ = alphabet[(unsigned char)s->result]; *o++ = '='; break;
    case step_A: break;
    }
    *o++ = '\n';
    return (int)(o - out);
}

int base64_decode_value(char c) {
    if (c >= 'A' && c <= 'Z') return c - 'A';
    if (c >= 'a' && c <= 'z') return c - 'a' + 26;
    if (c >= '0' && c <= '9') return c - '0' + 52;
    if (c == '+') return 62;
    if (c == '/') return 63;
    return -1;
}

void base64_init_decodestate(base64_decodestate *s) { s->step = step_a; s->plainchar = 0; }

int base64_decode_block(const char *in, const int length, char *out, base64_decodestate *s) {
    const char *p = in, *end = in + length;
    char *o = out;
    unsigned char partial = (unsigned char)s->plainchar; /* the bits carried over from the previous piece */
    while (p < end) {
        int v = base64_decode_value(*p++);
        if (v < 0) continue;
        switch (s->step) {
        case step_a: partial = (unsigned char)(v << 2); s->step = step_b; break;
        case step_b: *o++ = (char)(partial | (v >> 4)); partial = (unsigned char)((v & 0x0f) << 4); s->step = step_c; break;
        case step_c: *o++ = (char)(partial | (v >> 2)); partial = (unsigned char)((v & 0x03) << 6); s->step = step_d; break;
        case step_d: *o++ = (char)(partial | v); partial = 0; s->step = step_a; break;
        }
    }
    s->plainchar = (char)partial;
    return (int)(o - out);
}
