/* Timestamps for tasks/ingest/native/logscan.c: a clean line's `ts` as microseconds since the epoch,
 * what DuckDB's TRY_CAST(ts AS TIMESTAMPTZ) gives for it.
 *
 * Only one spelling is converted here, ISO 8601 with its offset written out:
 * YYYY-MM-DDTHH:MM:SS (or a space for the T), up to nine fraction digits (DuckDB keeps
 * six and drops the rest), then Z or +HH:MM / -HH:MM. Anything else (no offset, an
 * impossible date such as Feb 30, 24:00, a leap second, a far offset) makes the line
 * not clean, so DuckDB's own cast decides it on the slow path. */
#include <stdint.h>

static int ts_digits(const unsigned char *p, int n, int *out) {
    int v = 0;
    for (int i = 0; i < n; i++) {
        if (p[i] < '0' || p[i] > '9') return 0;
        v = v * 10 + (p[i] - '0');
    }
    *out = v;
    return 1;
}

static int ts_days_in_month(int y, int m) {
    static const int DAYS[] = {31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
    int leap = (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
    return DAYS[m - 1] + (m == 2 && leap);
}

/* Days from 1970-01-01 to a proleptic Gregorian date (H. Hinnant's days_from_civil). */
static int64_t ts_days_from_civil(int y, int m, int d) {
    y -= m <= 2;
    int64_t era = (y >= 0 ? y : y - 399) / 400;
    int64_t yoe = y - era * 400;
    int64_t doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + d - 1;
    int64_t doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    return era * 146097 + doe - 719468;
}

/* 1 and *micros set when p[0..n) is in the one spelling converted here. */
static int parse_ts(const unsigned char *p, size_t n, int64_t *micros) {
    int y, mo, d, h, mi, s, oh = 0, om = 0, sign = 0;
    if (n < 20 || p[4] != '-' || p[7] != '-' || (p[10] != 'T' && p[10] != ' ') || p[13] != ':' || p[16] != ':')
        return 0;
    if (!ts_digits(p, 4, &y) || !ts_digits(p + 5, 2, &mo) || !ts_digits(p + 8, 2, &d) ||
        !ts_digits(p + 11, 2, &h) || !ts_digits(p + 14, 2, &mi) || !ts_digits(p + 17, 2, &s))
        return 0;
    size_t i = 19;
    int64_t fraction = 0;
    if (p[i] == '.') {
        int places = 0;
        for (i++; i < n && p[i] >= '0' && p[i] <= '9'; i++, places++) {
            if (places == 9) return 0;
            if (places < 6) fraction = fraction * 10 + (p[i] - '0');
        }
        if (!places) return 0;
        for (; places < 6; places++) fraction *= 10;
    }
    if (i + 1 == n && p[i] == 'Z') {
        sign = 0;
    } else if (i + 6 == n && (p[i] == '+' || p[i] == '-') && p[i + 3] == ':') {
        if (!ts_digits(p + i + 1, 2, &oh) || !ts_digits(p + i + 4, 2, &om) || oh > 14 || om > 59) return 0;
        sign = p[i] == '-' ? -1 : 1;
    } else {
        return 0;
    }
    if (y < 1 || mo < 1 || mo > 12 || d < 1 || d > ts_days_in_month(y, mo) || h > 23 || mi > 59 || s > 59)
        return 0;
    int64_t seconds = ts_days_from_civil(y, mo, d) * 86400 + h * 3600 + mi * 60 + s
                      - (int64_t)sign * (oh * 3600 + om * 60);
    *micros = seconds * 1000000 + fraction;
    return 1;
}
