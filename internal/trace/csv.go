package trace

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// CSVSpecHelp describes the column spec of the "csv:SPEC" format, for help texts.
const CSVSpecHelp = `csv:SPEC reads delimited text, one request a line; SPEC is a comma-separated list of
  time=N, op=N, offset=N or lbn=N, size=N, volume=N   1-based column numbers (offset or lbn required)
  sector=BYTES      the unit of lbn (default 512)
  header=true       skip the first line
  sep=C             the separator: a character, or comma, tab, semicolon, space (any run of blanks);
                    default comma ("sep=," works as the last item)
Time, offset and size are integers (no decimals), offset and size in bytes; op is r/read, w/write, trim/discard/flush/sync/other (any case) or a
SCSI opcode in hex (28, 2a, 0x88 ...); without op every request is a read, without size every
request is one sector long. ID is the lbn when lbn is given, the offset otherwise. Example: csv:time=2,op=3,size=4,lbn=5,header=true`

const (
	csvTime = iota
	csvOp
	csvOffset
	csvLBN
	csvSize
	csvVolume
	csvRoles
)

var csvRoleNames = [csvRoles]string{"time", "op", "offset", "lbn", "size", "volume"}

// csvParser reads "csv:SPEC" traces (see CSVSpecHelp).
type csvParser struct {
	col        [csvRoles]int    // 1-based column of each role, 0 if absent
	roleOf     []int            // column-1 -> role+1, 0 for unused columns
	sep        byte             // 0: runs of blanks
	sector     int64            // bytes per lbn
	header     bool             // the first line is a header
	seenHeader bool             // the header line was skipped
	vols       *volumes         // nil without a volume column
	field      [csvRoles][]byte // this line's fields, reused
}

func newCSVParser(spec string) (*csvParser, error) {
	p := &csvParser{sep: ',', sector: 512}
	items := strings.Split(spec, ",")
	for i := 0; i < len(items); i++ {
		item := strings.TrimSpace(items[i])
		if item == "" {
			continue
		}
		key, val, ok := strings.Cut(item, "=")
		if !ok {
			return nil, fmt.Errorf("spec item %q is not key=value\n%s", item, CSVSpecHelp)
		}
		key = strings.ToLower(strings.TrimSpace(key))
		switch key {
		case "sep":
			switch strings.ToLower(val) {
			case "", "comma": // "sep=," splits into "sep=" and ""
				p.sep = ','
			case "tab", `\t`:
				p.sep = '\t'
			case "semicolon":
				p.sep = ';'
			case "space", "blank", "whitespace":
				p.sep = 0
			default:
				if len(val) != 1 {
					return nil, fmt.Errorf("sep=%q: want one character or comma, tab, semicolon, space", val)
				}
				p.sep = val[0]
			}
		case "header":
			b, err := strconv.ParseBool(val)
			if err != nil {
				return nil, fmt.Errorf("header=%q: want true or false", val)
			}
			p.header = b
		case "sector":
			n, err := strconv.ParseInt(val, 10, 64)
			if err != nil || n < 1 || n > 1<<30 {
				return nil, fmt.Errorf("sector=%q: want a size in bytes, such as 512 or 4096", val)
			}
			p.sector = n
		default:
			role := -1
			for r, name := range csvRoleNames {
				if key == name {
					role = r
				}
			}
			if role < 0 {
				return nil, fmt.Errorf("unknown spec key %q\n%s", key, CSVSpecHelp)
			}
			n, err := strconv.Atoi(val)
			if err != nil || n < 1 || n > 1024 {
				return nil, fmt.Errorf("%s=%q: want a column number from 1", key, val)
			}
			if p.col[role] != 0 {
				return nil, fmt.Errorf("%s given twice", key)
			}
			p.col[role] = n
		}
	}
	if (p.col[csvOffset] == 0) == (p.col[csvLBN] == 0) {
		return nil, fmt.Errorf("give exactly one of offset=N and lbn=N\n%s", CSVSpecHelp)
	}
	maxCol := 0
	for _, c := range p.col {
		maxCol = max(maxCol, c)
	}
	p.roleOf = make([]int, maxCol)
	for role, c := range p.col {
		if c == 0 {
			continue
		}
		if p.roleOf[c-1] != 0 {
			return nil, fmt.Errorf("column %d given to both %s and %s", c, csvRoleNames[p.roleOf[c-1]-1], csvRoleNames[role])
		}
		p.roleOf[c-1] = role + 1
	}
	if p.col[csvVolume] != 0 {
		p.vols = newVolumes(nil)
	}
	return p, nil
}

func (p *csvParser) parseLine(line []byte, r *Request) (bool, error) {
	if p.header && !p.seenHeader {
		p.seenHeader = true
		return false, nil
	}
	if isBlank(line) {
		return false, nil
	}
	rest := line
	for c := range p.roleOf {
		var f []byte
		more := true
		if p.sep == 0 {
			f, rest = wsField(rest)
			more = len(f) > 0
		} else {
			f, rest, more = sepField(rest, p.sep)
		}
		if role := p.roleOf[c]; role != 0 {
			p.field[role-1] = unquote(f)
		}
		if !more && c+1 < len(p.roleOf) {
			return false, fmt.Errorf("%d fields; the spec needs column %d", c+1, len(p.roleOf))
		}
	}
	*r = Request{Op: OpRead}
	var err error
	if p.col[csvTime] != 0 {
		if r.Time, err = parseInt(p.field[csvTime], "time"); err != nil {
			return false, err
		}
	}
	if p.col[csvOp] != 0 {
		var ok bool
		if r.Op, ok = parseOpWord(p.field[csvOp]); !ok {
			return false, fmt.Errorf("op %q: want r, read, w, write, trim, flush, sync or a SCSI opcode in hex", clip(p.field[csvOp]))
		}
	}
	if p.col[csvLBN] != 0 {
		lbn, err := parseUint(p.field[csvLBN], "lbn")
		if err != nil {
			return false, err
		}
		if r.Offset, _, err = sectorRange(lbn, 0, p.sector, "lbn"); err != nil {
			return false, err
		}
		r.ID = lbn
	} else {
		if r.Offset, err = parseInt63(p.field[csvOffset], "offset"); err != nil {
			return false, err
		}
		r.ID = uint64(r.Offset)
	}
	r.Length = p.sector
	if p.col[csvSize] != 0 {
		if r.Length, err = parseInt63(p.field[csvSize], "size"); err != nil {
			return false, err
		}
	}
	if p.vols != nil {
		if len(p.field[csvVolume]) == 0 {
			return false, errors.New("empty volume")
		}
		r.Volume = p.vols.id(p.field[csvVolume])
	}
	return true, nil
}

// unquote strips one pair of double quotes around a field.
func unquote(b []byte) []byte {
	if len(b) >= 2 && b[0] == '"' && b[len(b)-1] == '"' {
		return b[1 : len(b)-1]
	}
	return b
}
