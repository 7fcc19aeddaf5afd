package report

import (
	"bytes"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"strconv"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
	"golang.org/x/image/vector"
)

// PNG draws the chart as a w by h PNG image: the SVG's picture (axes,
// ticks, spread bands, mean lines, legend) rasterised in Go with a
// built-in bitmap font, for pages and documents that want images.
func (c Chart) PNG(w, h int) ([]byte, error) {
	img := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	text(img, marginLeft, 18, c.Title, color.Black)
	g, ok := c.geometry(w, h)
	if !ok {
		text(img, marginLeft, marginTop+20, "no data for "+c.Metric, color.Black)
		return encode(img)
	}
	grey, axis := color.RGBA{0xdd, 0xdd, 0xdd, 0xff}, color.RGBA{0x44, 0x44, 0x44, 0xff}
	left, top := float64(marginLeft), float64(marginTop)
	for i := 0; i <= 4; i++ {
		fx, x, fy, y := g.tick(i)
		stroke(img, [][2]float64{{left, y}, {left + g.pw, y}}, 1, grey)
		s := tick(fx)
		text(img, int(x)-len(s)*7/2, marginTop+int(g.ph)+15, s, color.Black)
		s = tick(fy)
		text(img, marginLeft-5-len(s)*7, int(y)+4, s, color.Black)
	}
	stroke(img, [][2]float64{{left, top}, {left, top + g.ph}, {left + g.pw, top + g.ph}}, 1, axis)
	text(img, int(left+g.pw/2)-7*7, h-5, "gradient steps", color.Black)
	for i, s := range c.Series {
		col := hexColor(palette[i%len(palette)])
		if s.Runs > 1 {
			var poly [][2]float64
			for j := range s.X {
				poly = append(poly, [2]float64{g.px(s.X[j]), g.py(s.Hi[j])})
			}
			for j := len(s.X) - 1; j >= 0; j-- {
				poly = append(poly, [2]float64{g.px(s.X[j]), g.py(s.Lo[j])})
			}
			band := col
			band.A = 0x26
			fill(img, poly, band)
		}
		var line [][2]float64
		for j := range s.X {
			line = append(line, [2]float64{g.px(s.X[j]), g.py(s.Y[j])})
		}
		stroke(img, line, 1.5, col)
		ly := float64(marginTop + 14*i)
		stroke(img, [][2]float64{{float64(w - g.right + 10), ly + 10}, {float64(w - g.right + 26), ly + 10}}, 2, col)
		text(img, w-g.right+30, int(ly)+14, legendLabel(s), color.Black)
	}
	return encode(img)
}

func encode(img image.Image) ([]byte, error) {
	var b bytes.Buffer
	err := png.Encode(&b, img)
	return b.Bytes(), err
}

func hexColor(s string) color.RGBA {
	v, _ := strconv.ParseUint(s[1:], 16, 32)
	return color.RGBA{uint8(v >> 16), uint8(v >> 8), uint8(v), 0xff}
}

// text writes s with its baseline at (x, y).
func text(img *image.RGBA, x, y int, s string, c color.Color) {
	d := font.Drawer{Dst: img, Src: image.NewUniform(c), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
	d.DrawString(s)
}

// fill paints a polygon (anti-aliased) in c, blending over img.
func fill(img *image.RGBA, poly [][2]float64, c color.RGBA) {
	if len(poly) < 3 {
		return
	}
	b := img.Bounds()
	r := vector.NewRasterizer(b.Dx(), b.Dy())
	r.MoveTo(float32(poly[0][0]), float32(poly[0][1]))
	for _, p := range poly[1:] {
		r.LineTo(float32(p[0]), float32(p[1]))
	}
	r.ClosePath()
	// Premultiplied source for Over.
	a := uint32(c.A)
	src := image.NewUniform(color.RGBA{uint8(uint32(c.R) * a / 255), uint8(uint32(c.G) * a / 255), uint8(uint32(c.B) * a / 255), c.A})
	r.DrawOp = draw.Over
	r.Draw(img, b, src, image.Point{})
}

// stroke draws a polyline of the given width as one quadrilateral per
// segment.
func stroke(img *image.RGBA, pts [][2]float64, width float64, c color.RGBA) {
	for i := 1; i < len(pts); i++ {
		x0, y0, x1, y1 := pts[i-1][0], pts[i-1][1], pts[i][0], pts[i][1]
		dx, dy := x1-x0, y1-y0
		n := math.Hypot(dx, dy)
		if n == 0 {
			continue
		}
		ox, oy := -dy/n*width/2, dx/n*width/2
		fill(img, [][2]float64{{x0 + ox, y0 + oy}, {x1 + ox, y1 + oy}, {x1 - ox, y1 - oy}, {x0 - ox, y0 - oy}}, c)
	}
}
