package specfile

import (
	"fmt"
	"strconv"
	"strings"
	"time"
)

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1},
}

// ParseSize parses a byte size written with an IEC unit ("512MiB", "64GiB") or as plain bytes.
// Decimal units ("64GB") are refused: they are ambiguous in resource specs.
func ParseSize(s string) (int64, error) {
	s = strings.TrimSpace(s)
	for _, u := range sizeUnits {
		if num, ok := strings.CutSuffix(s, u.suffix); ok {
			n, err := strconv.ParseFloat(strings.TrimSpace(num), 64)
			if err != nil || n < 0 {
				return 0, fmt.Errorf("%q is not a size (use e.g. 512MiB or 64GiB)", s)
			}
			return int64(n * float64(u.mult)), nil
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("%q is not a size (use e.g. 512MiB or 64GiB)", s)
	}
	return n, nil
}

// FormatSize writes n bytes with the largest IEC unit that keeps it readable.
func FormatSize(n int64) string {
	for _, u := range sizeUnits {
		if n >= u.mult && u.mult > 1 {
			return strconv.FormatFloat(float64(n)/float64(u.mult), 'f', 1, 64) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// ParseDuration parses a positive Go duration ("60s", "20m").
func ParseDuration(s string) (time.Duration, error) {
	d, err := time.ParseDuration(strings.TrimSpace(s))
	if err != nil || d <= 0 {
		return 0, fmt.Errorf("%q is not a positive duration (use e.g. 60s or 20m)", s)
	}
	return d, nil
}
