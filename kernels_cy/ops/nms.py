"""NonMaxSuppression: greedy per (batch, class) selection of boxes by descending score,
dropping every box whose intersection over union with a selected one exceeds the
threshold.

The order and arithmetic follow onnxruntime: candidates are the boxes scoring above
``score_threshold`` (all of them without one), ties in score go to the lower box index,
a box pair suppresses only when their IoU is strictly above ``iou_threshold``, and a
pair with an empty intersection or a degenerate box never suppresses. Each selection
is one vectorised IoU of the chosen box against the remaining candidates (the Python
loop runs once per selected box, not per pair)."""
from __future__ import annotations

import numpy as np

from onnxforge.kernels_cy.ops.base import Kernel, NodeSpec, register

__all__ = ["corners", "select_boxes"]


def corners(boxes: np.ndarray, center_point_box: int) -> tuple[np.ndarray, ...]:
    """``(x_min, x_max, y_min, y_max)`` of ``[..., 4]`` boxes: ``[y1, x1, y2, x2]`` corners in
    either order (0) or ``[x_center, y_center, width, height]`` (1)."""
    if center_point_box == 0:
        y1, x1, y2, x2 = (boxes[..., i] for i in range(4))
        return np.minimum(x1, x2), np.maximum(x1, x2), np.minimum(y1, y2), np.maximum(y1, y2)
    xc, yc, w, h = (boxes[..., i] for i in range(4))
    hw, hh = w / boxes.dtype.type(2), h / boxes.dtype.type(2)
    return xc - hw, xc + hw, yc - hh, yc + hh


def select_boxes(box: tuple[np.ndarray, ...], scores: np.ndarray, max_out: int, iou_threshold: float,
                 score_threshold: float | None) -> np.ndarray:
    """Indices of the boxes selected for one (batch, class), in selection order; ``box``
    holds the four corner arrays of :func:`corners` for this batch's boxes."""
    if max_out <= 0 or scores.size == 0:
        return np.empty(0, dtype=np.int64)
    cand = np.arange(scores.size) if score_threshold is None else np.flatnonzero(scores > score_threshold)
    if cand.size == 0:
        return np.empty(0, dtype=np.int64)
    # descending score, equal scores by ascending index: a stable sort on the negated score
    order = cand[np.argsort(-scores[cand].astype(np.float64), kind="stable")]
    x0, x1, y0, y1 = (c[order] for c in box)
    area = (x1 - x0) * (y1 - y0)
    t = x0.dtype.type
    alive = np.ones(order.size, dtype=bool)
    chosen: list[int] = []
    pos = 0
    while len(chosen) < max_out:
        rest = np.flatnonzero(alive[pos:])
        if rest.size == 0:
            break
        i = pos + int(rest[0])
        chosen.append(int(order[i]))
        alive[i] = False
        pos = i + 1
        if pos >= order.size:
            break
        ix = np.minimum(x1[pos:], x1[i]) - np.maximum(x0[pos:], x0[i])
        iy = np.minimum(y1[pos:], y1[i]) - np.maximum(y0[pos:], y0[i])
        inter = ix * iy
        union = area[pos:] + area[i] - inter
        with np.errstate(divide="ignore", invalid="ignore"):
            iou = inter / np.where(union > 0, union, t(1))
        hit = (ix > 0) & (iy > 0) & (inter > 0) & (area[pos:] > 0) & (area[i] > 0) & (union > 0) \
            & (iou > t(iou_threshold))
        alive[pos:] &= ~hit
    return np.asarray(chosen, dtype=np.int64)


def _scalar(x: np.ndarray | None, what: str, kernel: Kernel) -> float | None:
    if x is None or x.size == 0:
        return None
    if x.size != 1:
        raise kernel.error(f"{what} must hold one value, got shape {x.shape}")
    return x.reshape(-1)[0].item()


@register("", "NonMaxSuppression")
class NonMaxSuppression(Kernel):
    """Output: int64 ``[selected, 3]`` rows ``(batch, class, box)``, batch-major, then class,
    then selection order."""

    def __init__(self, spec: NodeSpec):
        super().__init__(spec)
        self.center = spec.int("center_point_box", 0)
        if self.center not in (0, 1):
            raise spec.fail(f"attribute center_point_box must be 0 or 1, got {self.center}")

    def run(self, boxes, scores, max_output=None, iou_threshold=None, score_threshold=None):
        if boxes.ndim != 3 or boxes.shape[2] != 4:
            raise self.error(f"boxes must have shape [batches, boxes, 4], got {boxes.shape}")
        if scores.ndim != 3 or scores.shape[0] != boxes.shape[0] or scores.shape[2] != boxes.shape[1]:
            raise self.error(f"scores must have shape [batches, classes, boxes] = "
                             f"[{boxes.shape[0]}, C, {boxes.shape[1]}], got {scores.shape}")
        m = _scalar(max_output, "max_output_boxes_per_class", self)
        max_out = 0 if m is None else max(int(m), 0)
        iou = _scalar(iou_threshold, "iou_threshold", self)
        iou = 0.0 if iou is None else float(iou)
        if not 0.0 <= iou <= 1.0:
            raise self.error(f"iou_threshold must lie in [0, 1], got {iou}")
        st = _scalar(score_threshold, "score_threshold", self)
        rows: list[np.ndarray] = []
        for b in range(boxes.shape[0]):
            box = corners(boxes[b], self.center)
            for c in range(scores.shape[1]):
                sel = select_boxes(box, scores[b, c], max_out, iou, None if st is None else float(st))
                if sel.size:
                    rows.append(np.stack([np.full(sel.size, b, np.int64), np.full(sel.size, c, np.int64), sel], axis=1))
        if not rows:
            return np.empty((0, 3), dtype=np.int64)
        return np.concatenate(rows, axis=0)
