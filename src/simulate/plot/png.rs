//! A palette PNG: the chunks written here, the pixels deflated by
//! `miniz_oxide`.

/// CRC-32 (ISO 3309) as PNG's chunks need it.
fn crc32(parts: &[&[u8]]) -> u32 {
    let mut crc = !0u32;
    for part in parts {
        for &b in *part {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
    }
    !crc
}

fn chunk(out: &mut Vec<u8>, kind: &[u8; 4], data: &[u8]) {
    out.extend_from_slice(&(data.len() as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(data);
    out.extend_from_slice(&crc32(&[kind, data]).to_be_bytes());
}

/// An 8-bit indexed PNG of `width × height` pixels, row after row, each
/// an index into `palette` (RGB).
pub fn encode(width: u32, height: u32, pixels: &[u8], palette: &[[u8; 3]]) -> Vec<u8> {
    debug_assert_eq!(pixels.len(), width as usize * height as usize);
    let mut raw = Vec::with_capacity(pixels.len() + height as usize);
    for row in pixels.chunks(width.max(1) as usize) {
        raw.push(0); // filter: none
        raw.extend_from_slice(row);
    }
    let mut out = b"\x89PNG\r\n\x1a\n".to_vec();
    let mut header = Vec::with_capacity(13);
    header.extend_from_slice(&width.to_be_bytes());
    header.extend_from_slice(&height.to_be_bytes());
    header.extend_from_slice(&[8, 3, 0, 0, 0]); // depth 8, indexed, deflate, filters, no interlace
    chunk(&mut out, b"IHDR", &header);
    chunk(&mut out, b"PLTE", &palette.concat());
    chunk(&mut out, b"IDAT", &miniz_oxide::deflate::compress_to_vec_zlib(&raw, 9));
    chunk(&mut out, b"IEND", &[]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc_is_png_s() {
        // The IEND chunk every PNG ends with.
        assert_eq!(crc32(&[b"IEND"]), 0xAE42_6082);
        assert_eq!(crc32(&[b"123456789"]), 0xCBF4_3926);
    }

    #[test]
    fn pixels_come_back_from_the_chunks() {
        let (w, h) = (7u32, 3u32);
        let pixels: Vec<u8> = (0..w * h).map(|i| (i % 2) as u8).collect();
        let png = encode(w, h, &pixels, &[[255, 255, 255], [0, 0, 0]]);
        assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
        // Walk the chunks, checking each CRC, and inflate IDAT.
        let (mut at, mut idat, mut kinds) = (8, Vec::new(), Vec::new());
        while at < png.len() {
            let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
            let kind = &png[at + 4..at + 8];
            let data = &png[at + 8..at + 8 + len];
            let crc = u32::from_be_bytes(png[at + 8 + len..at + 12 + len].try_into().unwrap());
            assert_eq!(crc, crc32(&[kind, data]));
            kinds.push(String::from_utf8_lossy(kind).into_owned());
            if kind == b"IHDR" {
                assert_eq!(&data[..8], &[0, 0, 0, 7, 0, 0, 0, 3]);
            }
            if kind == b"IDAT" {
                idat.extend_from_slice(data);
            }
            at += 12 + len;
        }
        assert_eq!(kinds, ["IHDR", "PLTE", "IDAT", "IEND"]);
        let raw = miniz_oxide::inflate::decompress_to_vec_zlib(&idat).unwrap();
        for (y, row) in raw.chunks(w as usize + 1).enumerate() {
            assert_eq!(row[0], 0);
            assert_eq!(&row[1..], &pixels[y * w as usize..(y + 1) * w as usize]);
        }
    }
}
