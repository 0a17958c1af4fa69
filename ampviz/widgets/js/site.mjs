// The course's static pages: every explorer that computes in the page is mounted where the page
// marks it (an element with data-ampviz-explorer naming its front end and data-ampviz-state naming
// the script element that holds its saved state), with the page's own model: no kernel.

import { pageModel } from "./page_model.mjs";
import * as blockExplorer from "./block_explorer_view.mjs";
import * as formatExplorer from "./format_explorer_view.mjs";
import * as fp8Lab from "./fp8_lab_view.mjs";
import * as rangeExplorer from "./range_explorer_view.mjs";
import * as scalerLab from "./scaler_lab_view.mjs";

export const VIEWS = { BrowserBlockExplorer: blockExplorer, BrowserFormatExplorer: formatExplorer, BrowserFp8ScalingLab: fp8Lab,
  BrowserRangeExplorer: rangeExplorer, BrowserScalerLab: scalerLab };

/** Mount every marked explorer of the document; returns how many were mounted. */
export function mountAll(doc = document) {
  let mounted = 0;
  for (const el of doc.querySelectorAll("[data-ampviz-explorer]")) {
    const view = VIEWS[el.dataset.ampvizExplorer];
    const holder = doc.getElementById(el.dataset.ampvizState);
    if (!view || !holder) {
      el.textContent = `This explorer could not be shown here (${el.dataset.ampvizExplorer}).`;
      continue;
    }
    view.default.render({ model: pageModel(JSON.parse(holder.textContent)), el });
    mounted += 1;
  }
  return mounted;
}
