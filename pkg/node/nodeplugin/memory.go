package nodeplugin

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// releaseStartupPages asks the kernel to reclaim the plugin's resident
// pages of its own executable (madvise MADV_PAGEOUT on its read-only
// mappings). It returns how many bytes of mappings it advised.
//
// Why: of the plugin's ~50 MiB RSS with 8 GPUs, about 36 MiB are clean
// pages of the executable, most of them touched once by package
// initialisation (client-go's API scheme registers every API group) and
// start-up, and fault-around maps code in 64 KiB runs. Those pages are
// never written, so reclaiming them costs nothing but a re-read where one
// is used again; what prepare and unprepare use faults back in within the
// first claims. Measured on the e2e node: 46 MiB once ready, 15 MiB right
// after, 34 MiB after 100 claims. Kernels before 5.4 do not know
// MADV_PAGEOUT: the call then fails, harmlessly.
func releaseStartupPages() (int, error) {
	exe, err := os.Readlink("/proc/self/exe")
	if err != nil {
		return 0, err
	}
	f, err := os.Open("/proc/self/maps")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	ranges, err := exeMappings(f, exe)
	if err != nil {
		return 0, err
	}
	total := 0
	for _, r := range ranges {
		if _, _, errno := unix.Syscall(unix.SYS_MADVISE, r[0], r[1]-r[0], unix.MADV_PAGEOUT); errno != 0 {
			return total, fmt.Errorf("madvise(MADV_PAGEOUT) %x-%x: %w", r[0], r[1], errno)
		}
		total += int(r[1] - r[0])
	}
	return total, nil
}

// exeMappings reads /proc/<pid>/maps and returns the [start, end) of each
// read-only, private mapping of the file exe: its code and read-only data,
// not its writable data or anything anonymous.
func exeMappings(maps io.Reader, exe string) ([][2]uintptr, error) {
	var out [][2]uintptr
	sc := bufio.NewScanner(maps)
	for sc.Scan() {
		// address perms offset dev inode path
		fs := strings.Fields(sc.Text())
		if len(fs) < 6 || strings.Join(fs[5:], " ") != exe {
			continue
		}
		if perms := fs[1]; len(perms) != 4 || perms[0] != 'r' || perms[1] != '-' || perms[3] != 'p' {
			continue
		}
		lo, hi, ok := strings.Cut(fs[0], "-")
		if !ok {
			return nil, fmt.Errorf("maps: bad address range %q", fs[0])
		}
		start, err := strconv.ParseUint(lo, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("maps: %w", err)
		}
		end, err := strconv.ParseUint(hi, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("maps: %w", err)
		}
		out = append(out, [2]uintptr{uintptr(start), uintptr(end)})
	}
	return out, sc.Err()
}
