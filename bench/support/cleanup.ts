/** What every benchmark module exports, and the cleanup stack the dispatcher runs whatever happens. */

export interface BenchModule {
  /** Runs the benchmark; resolves with the exit code (0 every target met, 1 a target missed). */
  run(args: string[], cleanup: Cleanup): Promise<number>;
}

/** A bad option; the dispatcher prints it and exits 2. */
export class UsageError extends Error {
  override name = 'UsageError';
}

/** Undo steps run last-in first-out, each once, a failing step not stopping the others. */
export class Cleanup {
  private readonly steps: Array<{ what: string; fn: () => unknown }> = [];
  private running: Promise<void> | undefined;

  add(what: string, fn: () => unknown): void {
    this.steps.push({ what, fn });
  }

  run(): Promise<void> {
    this.running ??= this.drain();
    return this.running;
  }

  private async drain(): Promise<void> {
    for (let step = this.steps.pop(); step; step = this.steps.pop()) {
      try {
        await step.fn();
      } catch (err) {
        console.error(`cleanup: ${step.what} failed: ${err instanceof Error ? err.message : String(err)}`);
      }
    }
  }
}
