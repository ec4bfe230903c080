//! A raster of palette indices: lines, boxes and text.

use super::font::glyph;

/// Palette entries.
pub const WHITE: u8 = 0;
pub const BLACK: u8 = 1;
pub const GRID: u8 = 2;
pub const BLUE: u8 = 3;
pub const RED: u8 = 4;
pub const GREEN: u8 = 5;
pub const PURPLE: u8 = 6;
pub const GREY: u8 = 7;

pub const PALETTE: [[u8; 3]; 8] = [
    [255, 255, 255],
    [20, 20, 20],
    [225, 225, 225],
    [31, 119, 180],
    [214, 39, 40],
    [44, 160, 44],
    [148, 103, 189],
    [110, 110, 110],
];

/// Text is drawn at twice the font's size: 10 × 14 pixels a character.
pub const SCALE: i32 = 2;
pub const CHAR_W: i32 = 6 * SCALE;
pub const CHAR_H: i32 = 7 * SCALE;

pub struct Canvas {
    pub width: i32,
    pub height: i32,
    pixels: Vec<u8>,
}

impl Canvas {
    pub fn new(width: i32, height: i32) -> Canvas {
        Canvas {
            width,
            height,
            pixels: vec![WHITE; (width.max(0) * height.max(0)) as usize],
        }
    }

    pub fn set(&mut self, x: i32, y: i32, color: u8) {
        if (0..self.width).contains(&x) && (0..self.height).contains(&y) {
            self.pixels[(y * self.width + x) as usize] = color;
        }
    }

    pub fn fill(&mut self, x: i32, y: i32, w: i32, h: i32, color: u8) {
        for yy in y..y + h {
            for xx in x..x + w {
                self.set(xx, yy, color);
            }
        }
    }

    /// A line `thick` pixels wide (Bresenham, each point a square).
    pub fn line(&mut self, (x0, y0): (i32, i32), (x1, y1): (i32, i32), thick: i32, color: u8) {
        let (dx, dy) = ((x1 - x0).abs(), -(y1 - y0).abs());
        let (sx, sy) = (if x0 < x1 { 1 } else { -1 }, if y0 < y1 { 1 } else { -1 });
        let (mut x, mut y, mut err) = (x0, y0, dx + dy);
        loop {
            self.fill(x - thick / 2, y - thick / 2, thick, thick, color);
            if x == x1 && y == y1 {
                break;
            }
            let e2 = 2 * err;
            if e2 >= dy {
                err += dy;
                x += sx;
            }
            if e2 <= dx {
                err += dx;
                y += sy;
            }
        }
    }

    /// `text` with its top left corner at (x, y).
    pub fn text(&mut self, x: i32, y: i32, text: &str, color: u8) {
        for (i, c) in text.chars().enumerate() {
            let left = x + i as i32 * CHAR_W;
            for (row, bits) in glyph(c).iter().enumerate() {
                for col in 0..5 {
                    if bits & (0x10 >> col) != 0 {
                        self.fill(left + col * SCALE, y + row as i32 * SCALE, SCALE, SCALE, color);
                    }
                }
            }
        }
    }

    pub fn text_width(text: &str) -> i32 {
        text.chars().count() as i32 * CHAR_W - SCALE
    }

    pub fn into_png(self) -> Vec<u8> {
        super::png::encode(self.width as u32, self.height as u32, &self.pixels, &PALETTE)
    }

    #[cfg(test)]
    pub fn at(&self, x: i32, y: i32) -> u8 {
        self.pixels[(y * self.width + x) as usize]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_reach_both_ends_and_stay_inside() {
        let mut c = Canvas::new(20, 10);
        c.line((0, 0), (19, 9), 1, RED);
        assert_eq!(c.at(0, 0), RED);
        assert_eq!(c.at(19, 9), RED);
        assert_eq!(c.at(19, 0), WHITE);
        // Off the canvas: clipped, no panic.
        c.line((-50, -50), (100, 100), 3, BLUE);
        c.text(15, 5, "999", BLACK);
    }

    #[test]
    fn text_draws_its_glyphs() {
        let mut c = Canvas::new(40, 20);
        c.text(0, 0, "1", BLACK);
        // '1': the top row's middle column, twice the size.
        assert_eq!(c.at(2 * SCALE, 0), BLACK);
        assert_eq!(c.at(0, 0), WHITE);
        assert_eq!(Canvas::text_width("ab"), 2 * CHAR_W - SCALE);
    }
}
