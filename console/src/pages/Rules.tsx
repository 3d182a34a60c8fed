/** The user's notification rules (to be built). */
export function Rules() {
  return (
    <main>
      <h1>Rules</h1>
    </main>
  );
}
