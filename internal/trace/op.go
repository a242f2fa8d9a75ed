package trace

// scsiOp maps a SCSI command's opcode to a direction: READ(6/10/12/16) and WRITE(6/10/12/16);
// everything else (SYNCHRONIZE CACHE, UNMAP, INQUIRY ...) is OpOther. libCacheSim's vscsi reader
// keeps no direction at all, so a simulation that must match its figures counts every op.
func scsiOp(code uint64) Op {
	switch code {
	case 0x08, 0x28, 0xa8, 0x88:
		return OpRead
	case 0x0a, 0x2a, 0xaa, 0x8a:
		return OpWrite
	}
	return OpOther
}

// parseOpWord reads an op column: r/read and w/write (any case), the words trim, discard, flush,
// sync and other, or a SCSI opcode in hex (with or without 0x). ok is false for anything else.
func parseOpWord(b []byte) (op Op, ok bool) {
	switch {
	case foldEq(b, "r"), foldEq(b, "read"):
		return OpRead, true
	case foldEq(b, "w"), foldEq(b, "write"):
		return OpWrite, true
	case foldEq(b, "trim"), foldEq(b, "discard"), foldEq(b, "flush"), foldEq(b, "sync"), foldEq(b, "other"):
		return OpOther, true
	}
	if len(b) > 2 && b[0] == '0' && (b[1] == 'x' || b[1] == 'X') {
		b = b[2:]
	}
	if len(b) == 0 || len(b) > 2 {
		return 0, false
	}
	var code uint64
	for _, c := range b {
		switch {
		case '0' <= c && c <= '9':
			code = code<<4 | uint64(c-'0')
		case 'a' <= c && c <= 'f':
			code = code<<4 | uint64(c-'a'+10)
		case 'A' <= c && c <= 'F':
			code = code<<4 | uint64(c-'A'+10)
		default:
			return 0, false
		}
	}
	return scsiOp(code), true
}
