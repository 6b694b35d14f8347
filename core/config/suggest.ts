// "Did you mean ...?" for a misspelt key or plug-in name: the closest known name by edit distance, offered
// only when it is close enough to be the likely intent (a third of the longer name, at least 2 edits).

/** Levenshtein distance (insert, delete, substitute; a swap of neighbours counts as one edit). */
function editDistance(a: string, b: string): number {
  const m = a.length;
  const n = b.length;
  let prev2: number[] = [];
  let prev = Array.from({ length: n + 1 }, (_, j) => j);
  for (let i = 1; i <= m; i++) {
    const cur = [i];
    for (let j = 1; j <= n; j++) {
      const cost = a[i - 1] === b[j - 1] ? 0 : 1;
      let d = Math.min(prev[j]! + 1, cur[j - 1]! + 1, prev[j - 1]! + cost);
      if (i > 1 && j > 1 && a[i - 1] === b[j - 2] && a[i - 2] === b[j - 1]) d = Math.min(d, prev2[j - 2]! + 1);
      cur.push(d);
    }
    prev2 = prev;
    prev = cur;
  }
  return prev[n]!;
}

/** The known name closest to `name`, or null when none is plausibly meant. */
export function closest(name: string, known: Iterable<string>): string | null {
  let best: string | null = null;
  let bestD = Infinity;
  for (const k of known) {
    const d = editDistance(name.toLowerCase(), k.toLowerCase());
    if (d < bestD) {
      best = k;
      bestD = d;
    }
  }
  if (best === null) return null;
  return bestD <= Math.max(2, Math.floor(Math.max(name.length, best.length) / 3)) ? best : null;
}

/** " (did you mean x?)" or "", to append to a message. */
export function didYouMean(name: string, known: Iterable<string>): string {
  const c = closest(name, known);
  return c === null ? '' : ` (did you mean ${c}?)`;
}
